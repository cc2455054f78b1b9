package rpc

import "time"

// SetDetectClock makes s's protocol detection read the time from now; call
// it before Serve.
func SetDetectClock(s *Server, now func() time.Time) {
	if s.detect != nil {
		s.detect.now = now
	}
}

// DetectEvictions is how many decided peers s's detection forgot for
// newly decided ones, and how many peers its undecided table holds; read
// as DetectPeers is.
func DetectEvictions(s *Server) (evicted int64, undecided int) {
	if s.detect == nil {
		return 0, 0
	}
	return s.detect.evicted, s.detect.undecided.Len()
}
