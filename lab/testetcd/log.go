package testetcd

import "go.uber.org/zap"

// nopLogger keeps the etcd client's own log out of test output.
func nopLogger() *zap.Logger { return zap.NewNop() }
