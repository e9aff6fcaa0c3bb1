package testproc

import "net"

// FreePort is a port on 127.0.0.1 that nothing listened on a moment ago,
// for a test server to bind. Another process may take it in between; the
// helpers that start servers retry or fail with the server's log.
func FreePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
