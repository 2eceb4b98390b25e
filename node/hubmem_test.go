package node

import (
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// TestHubPublishAllocatesNoSharedRendering: an event's shared rendering is
// made by the first subscriber that reads it, not when it is published, so
// that the history costs nothing more with nobody reading it
// (TestEventsRenderedOnce checks that subscribers still share it).
func TestHubPublishAllocatesNoSharedRendering(t *testing.T) {
	h := newHub(8)
	evs := make([]hubEvent, 5)
	for i := range evs {
		evs[i] = hubEvent{Event: fsm.Event{Index: uint64(i + 1), Type: fsm.EventAcquired, Key: "k"}}
	}
	h.publish(evs)
	for i := h.start; i < h.end; i++ {
		if h.ring[i%uint64(len(h.ring))].shared != nil {
			t.Fatalf("event %d has a shared rendering before any subscriber read it", i)
		}
	}
}
