// Package fakeresp is a RESP node on 127.0.0.1 for tests: it reads
// commands (arrays of bulk strings, as clients send them) and answers each
// with the raw bytes its handler returns, so a test can send what no real
// server would: negative or huge lengths, redirect loops, values of
// another length. It counts the connections it accepted and the commands
// it was sent, by name.
package fakeresp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Handler answers cmd (its name upper-cased) with raw RESP bytes; nil
// closes the connection without an answer.
type Handler func(cmd []string) []byte

// Node is one fake node.
type Node struct {
	ln      net.Listener
	handler atomic.Pointer[Handler]

	accepted atomic.Int64
	open     atomic.Int64

	mu    sync.Mutex
	count map[string]int64
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Start listens on a free port of 127.0.0.1 and serves until the test ends.
func Start(t testing.TB, h Handler) *Node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("fakeresp: listen: %v", err)
	}
	n := &Node{ln: ln, count: map[string]int64{}, conns: map[net.Conn]struct{}{}}
	n.SetHandler(h)
	n.wg.Add(1)
	go n.serve()
	t.Cleanup(n.Close)
	return n
}

// Addr is "127.0.0.1:port".
func (n *Node) Addr() string { return n.ln.Addr().String() }

// Port is the node's port.
func (n *Node) Port() int { return n.ln.Addr().(*net.TCPAddr).Port }

// SetHandler replaces the handler (for the commands after it).
func (n *Node) SetHandler(h Handler) { n.handler.Store(&h) }

// Accepted is how many connections the node accepted.
func (n *Node) Accepted() int64 { return n.accepted.Load() }

// Open is how many of them are open now.
func (n *Node) Open() int64 { return n.open.Load() }

// Count is how many commands named name (upper case) the node was sent.
func (n *Node) Count(name string) int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.count[name]
}

// Close stops the node and closes its connections.
func (n *Node) Close() {
	n.ln.Close()
	n.mu.Lock()
	for c := range n.conns {
		c.Close()
	}
	n.mu.Unlock()
	n.wg.Wait()
}

func (n *Node) serve() {
	defer n.wg.Done()
	for {
		c, err := n.ln.Accept()
		if err != nil {
			return
		}
		n.accepted.Add(1)
		n.open.Add(1)
		n.mu.Lock()
		n.conns[c] = struct{}{}
		n.mu.Unlock()
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer n.open.Add(-1)
			defer func() {
				n.mu.Lock()
				delete(n.conns, c)
				n.mu.Unlock()
				c.Close()
			}()
			n.session(c)
		}()
	}
}

func (n *Node) session(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		cmd, err := readCommand(r)
		if err != nil {
			return
		}
		name := strings.ToUpper(cmd[0])
		cmd[0] = name
		n.mu.Lock()
		n.count[name]++
		n.mu.Unlock()
		reply := (*n.handler.Load())(cmd)
		if reply == nil {
			return
		}
		if _, err := c.Write(reply); err != nil {
			return
		}
	}
}

// maxArg bounds an argument the node reads (a value a test SETs).
const maxArg = 1 << 30

func readCommand(r *bufio.Reader) ([]string, error) {
	n, err := readLen(r, '*')
	if err != nil {
		return nil, err
	}
	if n < 1 || n > 1024 {
		return nil, fmt.Errorf("fakeresp: a command of %d arguments", n)
	}
	cmd := make([]string, n)
	for i := range cmd {
		l, err := readLen(r, '$')
		if err != nil {
			return nil, err
		}
		if l < 0 || l > maxArg {
			return nil, fmt.Errorf("fakeresp: an argument of %d bytes", l)
		}
		b := make([]byte, l+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		cmd[i] = string(b[:l])
	}
	return cmd, nil
}

func readLen(r *bufio.Reader, typ byte) (int, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 4 || line[0] != typ || !strings.HasSuffix(line, "\r\n") {
		return 0, errors.New("fakeresp: not a command")
	}
	return strconv.Atoi(line[1 : len(line)-2])
}

// Replies every handler needs.

// OK is "+OK".
var OK = []byte("+OK\r\n")

// Int is ":n".
func Int(n int64) []byte { return []byte(":" + strconv.FormatInt(n, 10) + "\r\n") }

// Bulk is s as a bulk string.
func Bulk(s []byte) []byte {
	b := []byte("$" + strconv.Itoa(len(s)) + "\r\n")
	b = append(b, s...)
	return append(b, "\r\n"...)
}

// Err is "-msg".
func Err(msg string) []byte { return []byte("-" + msg + "\r\n") }

// Slots is a CLUSTER SLOTS reply: every slot served by the node at addr.
func Slots(addr string) []byte {
	host, port, _ := net.SplitHostPort(addr)
	return []byte("*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n" +
		"$" + strconv.Itoa(len(host)) + "\r\n" + host + "\r\n:" + port + "\r\n")
}

// Basic answers what a client asks when it connects and probes: HELLO
// as an unknown command (the client falls back to RESP2), CLIENT and
// SELECT with OK, PING with PONG; else nil (the caller answers).
func Basic(cmd []string) []byte {
	switch cmd[0] {
	case "HELLO":
		return Err("ERR unknown command 'HELLO'")
	case "CLIENT", "SELECT", "AUTH":
		return OK
	case "PING":
		return []byte("+PONG\r\n")
	}
	return nil
}
