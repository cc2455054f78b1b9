package rpc

import (
	"fmt"

	"kvdock/core/protocol"
)

// The accessors below give handlers typed arguments with errors that name
// the request and the position, so a wrong payload never panics a handler.

// Arity checks the argument count.
func (r *Request) Arity(n int) error {
	if len(r.Args) != n {
		return fmt.Errorf("%s: %d arguments, want %d", r.Name, len(r.Args), n)
	}
	return nil
}

func (r *Request) arg(i int) (any, error) {
	if i < 0 || i >= len(r.Args) {
		return nil, fmt.Errorf("%s: no argument %d (%d given)", r.Name, i, len(r.Args))
	}
	return r.Args[i], nil
}

// Key returns argument i as a cache key.
func (r *Request) Key(i int) (protocol.Key, error) {
	v, err := r.arg(i)
	if err != nil {
		return protocol.Key{}, err
	}
	switch k := v.(type) {
	case protocol.Key:
		return k, nil
	case *protocol.Key:
		if k != nil {
			return *k, nil
		}
	}
	return protocol.Key{}, fmt.Errorf("%s: argument %d is %T, want a key", r.Name, i, v)
}

// Int returns argument i as an integer.
func (r *Request) Int(i int) (int64, error) {
	v, err := r.arg(i)
	if err != nil {
		return 0, err
	}
	switch n := v.(type) {
	case int64:
		return n, nil
	case *int64:
		if n != nil {
			return *n, nil
		}
	case int:
		return int64(n), nil
	}
	return 0, fmt.Errorf("%s: argument %d is %T, want an int", r.Name, i, v)
}

// OptInt returns argument i as an optional integer (payload type "int?"):
// present is false for a msgpack nil.
func (r *Request) OptInt(i int) (n int64, present bool, err error) {
	v, err := r.arg(i)
	if err != nil {
		return 0, false, err
	}
	switch x := v.(type) {
	case nil:
		return 0, false, nil
	case *int64:
		if x == nil {
			return 0, false, nil
		}
		return *x, true, nil
	case int64:
		return x, true, nil
	case int:
		return int64(x), true, nil
	}
	return 0, false, fmt.Errorf("%s: argument %d is %T, want an int or nil", r.Name, i, v)
}

// Str returns argument i as a string.
func (r *Request) Str(i int) (string, error) {
	v, err := r.arg(i)
	if err != nil {
		return "", err
	}
	if s, ok := v.(string); ok {
		return s, nil
	}
	return "", fmt.Errorf("%s: argument %d is %T, want a str", r.Name, i, v)
}

// Bytes returns argument i as bytes (a slice of the received frame: valid
// only while the handler runs).
func (r *Request) Bytes(i int) ([]byte, error) {
	v, err := r.arg(i)
	if err != nil {
		return nil, err
	}
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return nil, fmt.Errorf("%s: argument %d is %T, want bytes", r.Name, i, v)
}

// Register returns argument i as a non-GPU registration payload.
func (r *Request) Register(i int) (protocol.RegisterPayload, error) {
	v, err := r.arg(i)
	if err != nil {
		return protocol.RegisterPayload{}, err
	}
	switch p := v.(type) {
	case protocol.RegisterPayload:
		return p, nil
	case *protocol.RegisterPayload:
		if p != nil {
			return *p, nil
		}
	}
	return protocol.RegisterPayload{}, fmt.Errorf("%s: argument %d is %T, want a registration payload", r.Name, i, v)
}
