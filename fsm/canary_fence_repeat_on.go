//go:build canary_fence_repeat

package fsm

// canaryFenceRepeat (build tag canary_fence_repeat) is a deliberate bug for
// the chaos suite to catch: the next grant on a key whose lease was released
// takes the released lease's fencing token again, so two holders of the key
// carry one token and a fenced resource cannot tell them apart. Never set in
// a normal build.
const canaryFenceRepeat = true
