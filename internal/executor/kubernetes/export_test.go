package kubernetes

// IgnoreExecNoNode makes the runner overlook the API server's NotFound
// for a lost node's exec until the returned function is called, so that
// a test sees the node named from the pod garbage collector's mark.
func IgnoreExecNoNode() (restore func()) {
	ignoreExecNoNode.Store(true)
	return func() { ignoreExecNoNode.Store(false) }
}
