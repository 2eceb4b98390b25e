package fsm

// idIndex is an ordered set of ids: a treap whose priorities are a hash of
// the id, so its shape depends only on its contents (deterministic, no
// randomness). It lets listings walk ids in order from a cursor without
// sorting every record on every page.
type idIndex struct {
	root *treapNode
	n    int
}

type treapNode struct {
	id          string
	prio        uint64
	left, right *treapNode
}

func treapPrio(s string) uint64 {
	h := uint64(14695981039346656037) // FNV-1a
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

func (x *idIndex) insert(id string) {
	var added bool
	x.root, added = treapInsert(x.root, id, treapPrio(id))
	if added {
		x.n++
	}
}

func treapInsert(t *treapNode, id string, p uint64) (*treapNode, bool) {
	if t == nil {
		return &treapNode{id: id, prio: p}, true
	}
	var added bool
	switch {
	case id < t.id:
		t.left, added = treapInsert(t.left, id, p)
		if t.left.prio > t.prio {
			l := t.left
			t.left, l.right = l.right, t
			return l, added
		}
	case id > t.id:
		t.right, added = treapInsert(t.right, id, p)
		if t.right.prio > t.prio {
			r := t.right
			t.right, r.left = r.left, t
			return r, added
		}
	}
	return t, added
}

func (x *idIndex) remove(id string) {
	var removed bool
	x.root, removed = treapRemove(x.root, id)
	if removed {
		x.n--
	}
}

func treapRemove(t *treapNode, id string) (*treapNode, bool) {
	if t == nil {
		return nil, false
	}
	var removed bool
	switch {
	case id < t.id:
		t.left, removed = treapRemove(t.left, id)
	case id > t.id:
		t.right, removed = treapRemove(t.right, id)
	default:
		return treapMerge(t.left, t.right), true
	}
	return t, removed
}

func treapMerge(a, b *treapNode) *treapNode {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.prio > b.prio:
		a.right = treapMerge(a.right, b)
		return a
	default:
		b.left = treapMerge(a, b.left)
		return b
	}
}

// ascend calls fn for each id greater than after, in order, until fn
// returns false.
func (x *idIndex) ascend(after string, fn func(id string) bool) {
	var stack []*treapNode
	t := x.root
	for t != nil { // descend to the first id > after, remembering the path
		if t.id > after {
			stack = append(stack, t)
			t = t.left
		} else {
			t = t.right
		}
	}
	for len(stack) > 0 {
		t = stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if !fn(t.id) {
			return
		}
		for c := t.right; c != nil; c = c.left {
			stack = append(stack, c)
		}
	}
}

// fromSorted replaces the contents with the n ids id(0) < id(1) < ... in
// O(n): the treap of distinct priorities is unique, so building it along its
// right spine gives the same tree as n inserts.
func (x *idIndex) fromSorted(n int, id func(int) string) {
	var spine []*treapNode
	for i := range n {
		s := id(i)
		t := &treapNode{id: s, prio: treapPrio(s)}
		var last *treapNode
		for len(spine) > 0 && spine[len(spine)-1].prio < t.prio {
			last = spine[len(spine)-1]
			spine = spine[:len(spine)-1]
		}
		t.left = last
		if len(spine) > 0 {
			spine[len(spine)-1].right = t
		}
		spine = append(spine, t)
	}
	x.root, x.n = nil, n
	if len(spine) > 0 {
		x.root = spine[0]
	}
}
