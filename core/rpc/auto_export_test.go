package rpc

import "time"

// SetDetectClock makes s's protocol detection read the time from now; call
// it before Serve.
func SetDetectClock(s *Server, now func() time.Time) {
	if s.detect != nil {
		s.detect.now = now
	}
}

// DetectEvictions is how many decided peers s's detection forgot after
// their idle time, and how many decisions it kept among the undecided
// because every decided peer was active; read as DetectPeers is.
func DetectEvictions(s *Server) (evicted, overflow int64) {
	if s.detect == nil {
		return 0, 0
	}
	return s.detect.evicted, s.detect.overflow
}
