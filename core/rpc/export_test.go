package rpc

// DetectPeers is the number of peers whose detection state s keeps; read
// only after the server stopped serving or between its socket's messages in
// tests that wait for each reply.
func DetectPeers(s *Server) int {
	if s.detect == nil {
		return 0
	}
	return s.detect.size()
}
