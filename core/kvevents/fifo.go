package kvevents

// fifo is a ring of T that drops its oldest items when told: the replay
// buffer and the poll log, each bounded by a count and by the bytes its
// items hold.
type fifo[T any] struct {
	buf     []T
	head, n int
}

// len is the number of items held.
func (f *fifo[T]) len() int { return f.n }

// at is the i-th oldest item (0 the oldest); i < len.
func (f *fifo[T]) at(i int) *T { return &f.buf[(f.head+i)%len(f.buf)] }

// push adds v as the newest item, growing the ring when it is full.
func (f *fifo[T]) push(v T) {
	if f.n == len(f.buf) {
		grown := make([]T, max(16, 2*len(f.buf)))
		for i := range f.n {
			grown[i] = *f.at(i)
		}
		f.buf, f.head = grown, 0
	}
	f.buf[(f.head+f.n)%len(f.buf)] = v
	f.n++
}

// pop removes and returns the oldest item; len > 0.
func (f *fifo[T]) pop() T {
	var zero T
	v := f.buf[f.head]
	f.buf[f.head] = zero // let what it held go
	f.head = (f.head + 1) % len(f.buf)
	f.n--
	return v
}
