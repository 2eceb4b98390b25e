package grant

import (
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/godeps"
)

// TestStandardLibraryOnly: the package links nothing but the standard
// library, so a resource can verify grants without any of the server's
// dependencies.
func TestStandardLibraryOnly(t *testing.T) {
	deps := godeps.Deps(t, "github.com/leasehold/leasehold/wire/grant")
	if len(deps) == 0 {
		t.Fatal("go list -deps printed nothing")
	}
	for _, d := range deps {
		first, _, _ := strings.Cut(d, "/")
		if d != "github.com/leasehold/leasehold/wire/grant" && strings.Contains(first, ".") {
			t.Errorf("grant links %s", d)
		}
	}
}
