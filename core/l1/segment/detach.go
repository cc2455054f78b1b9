package segment

import "golang.org/x/sys/unix"

// Detach is Close without the unmap, for a pool whose memory may still be
// read or written through views that were not returned in time: it stops
// the prefault, unlinks the segment's names (if they are still this segment) and
// releases the flock, but the mapping stays valid until the process exits,
// so a late copy cannot fault. Bytes keeps answering the mapping. Detach and
// Close share one once: after either, the other does nothing.
func (s *Segment) Detach() error {
	var err error
	s.once.Do(func() {
		s.stop.Store(true)
		<-s.done
		if s.fd < 0 {
			return
		}
		err = unlinkNames(s.fd, s.dir, s.name)
		unix.Close(s.fd) // releases the flock
		s.fd = -1
	})
	return err
}
