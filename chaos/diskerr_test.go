package chaos

import (
	"strings"
	"testing"
)

// withoutStorePanic drops Raft's stop on a failing stable store and its
// dump, and nothing else: another panic, or the same one for another
// reason, still fails logs-clean.
func TestWithoutStorePanic(t *testing.T) {
	log := strings.Join([]string{
		`time=1 level=INFO msg=ok`,
		`panic: failed to save current term: write /x/raft.db: input/output error`,
		``,
		`goroutine 63 [running]:`,
		`github.com/hashicorp/raft.(*Raft).setCurrentTerm(0x1, 0x3)`,
		``,
		`goroutine 1 [select]:`,
		startHeader + `n1 at now ====`,
		`time=2 level=INFO msg=back`,
		`panic: failed to save current term: bolt: database not open`,
		`panic: runtime error: index out of range`,
	}, "\n")
	got := CheckLogs(map[string]string{"n1.log": withoutStorePanic(log)})
	if got.Valid || got.Counts["bad-lines"] != 2 {
		t.Fatalf("want the two other panics only, got %+v", got)
	}
	if strings.Contains(withoutStorePanic(log), "goroutine 63") || !strings.Contains(withoutStorePanic(log), "msg=back") {
		t.Fatalf("the dump stays or the restart's lines went:\n%s", withoutStorePanic(log))
	}
}
