package l1

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPythonAttachesSegment plays an LMCache worker: /usr/bin/python3
// attaches the kvdock segment by name with multiprocessing.shared_memory,
// unregisters it from the resource tracker (else Python < 3.13 unlinks it at
// exit), writes at the offset ReserveWrite chose and reads what Go wrote.
func TestPythonAttachesSegment(t *testing.T) {
	name := fmt.Sprintf("%skvdocktest_%d_%08x", SegmentPrefix, os.Getpid(), rand.Uint32())
	p, err := Open(Options{Size: 4 << 20, Plan: Decision{Segment: name}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := p.Decision()
	if !d.Shared || d.Segment != name {
		t.Fatalf("decision %+v, want shared segment %s", d, name)
	}
	res, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 2), 100_000)
	if err != nil {
		t.Fatal(err)
	}
	fromGo := bytes.Repeat([]byte("go->py "), 8)
	b, release := p.View(res[1].Offset, res[1].Length)
	copy(b, fromGo)
	release()

	const script = `
import sys
from multiprocessing import shared_memory, resource_tracker
name, woff, roff, rlen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
shm = shared_memory.SharedMemory(name=name, create=False)
resource_tracker.unregister(shm._name, "shared_memory")
shm.buf[woff:woff+13] = b"python wrote!"
sys.stdout.write(bytes(shm.buf[roff:roff+rlen]).decode() + "\n" + str(shm.size) + "\n")
shm.close()
`
	out, err := exec.Command("/usr/bin/python3", "-c", script, name,
		fmt.Sprint(res[0].Offset), fmt.Sprint(res[1].Offset), fmt.Sprint(len(fromGo))).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || lines[0] != string(fromGo) || lines[1] != fmt.Sprint(4<<20) {
		t.Fatalf("python read %q, want %q and size %d", lines, fromGo, 4<<20)
	}
	got, release := p.View(res[0].Offset, 13)
	seen := string(got)
	release()
	if seen != "python wrote!" {
		t.Fatalf("Go sees %q at the offset Python wrote", seen)
	}
	time.Sleep(200 * time.Millisecond) // give a (wrongly) registered tracker time to unlink
	if _, err := os.Stat(filepath.Join("/dev/shm", name)); err != nil {
		t.Fatalf("segment gone after Python exited: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", name)); !os.IsNotExist(err) {
		t.Fatalf("segment still exists after Close: %v", err)
	}
}
