package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"
	"github.com/leasehold/leasehold/wire"
)

// The console tests drive a real headless Chromium (Debian's chromium
// package; .ci/run installs it) and skip only when there is none.

// uiDeadline bounds every wait for the page to show something: generous, so
// that a loaded machine is slow but never wrong.
const uiDeadline = 60 * time.Second

// chromiumPath finds a Chromium binary, or "".
func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// uiShotsDir is where the console tests write their screenshots:
// $LEASEHOLD_UI_SHOTS, or leasehold-ui-shots in the system's temporary
// directory.
func uiShotsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("LEASEHOLD_UI_SHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "leasehold-ui-shots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser is one headless Chromium tab.
type browser struct {
	t     *testing.T
	ctx   context.Context
	shots string
	name  string // screenshot file prefix
}

// needChromium skips the test when there is no Chromium to drive, and
// returns its path. Call it before starting servers: the browser must be
// started after them, so that it is closed (and its event streams with it)
// before they are.
func needChromium(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a browser")
	}
	path := chromiumPath()
	if path == "" {
		t.Skip("no chromium binary (apt-get install chromium)")
	}
	return path
}

// newBrowser starts a headless Chromium; see needChromium.
func newBrowser(t *testing.T, path, name string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox refuses to start
		chromedp.WindowSize(1280, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
	})
	// The first Run starts the browser; it lives as long as ctx.
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	// Any uncaught JavaScript exception of the page fails the test.
	var mu sync.Mutex
	var thrown []string
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*cdpruntime.EventExceptionThrown); ok && e.ExceptionDetails != nil {
			msg := e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				msg += " " + e.ExceptionDetails.Exception.Description
			}
			mu.Lock()
			thrown = append(thrown, msg)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range thrown {
			t.Errorf("the page threw: %s", m)
		}
	})
	b := &browser{t: t, ctx: ctx, shots: uiShotsDir(t), name: name}
	t.Logf("screenshots of the console go to %s", b.shots)
	return b
}

// run runs one action with a bound of its own.
func run[T any](b *browser, a chromedp.Action[T]) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, uiDeadline)
	defer cancel()
	return chromedp.Run(ctx, a)
}

// eval evaluates a JavaScript expression and decodes its value into T.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	v, err := run(b, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript condition until it is true; on a timeout it
// fails with a screenshot and the page's text.
func (b *browser) waitFor(what, cond string) {
	b.t.Helper()
	deadline := time.Now().Add(uiDeadline)
	for {
		ok, err := run(b, chromedp.Evaluate[bool]("!!("+cond+")"))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.shot("timeout")
			text, _ := run(b, chromedp.Evaluate[string]("document.body.innerText"))
			b.t.Fatalf("timed out after %v waiting for the page to show %s (last error %v); page text:\n%s", uiDeadline, what, err, text)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shot writes a full-page screenshot and returns its path.
func (b *browser) shot(name string) string {
	b.t.Helper()
	png, err := run(b, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Errorf("screenshot %s: %v", name, err)
		return ""
	}
	p := filepath.Join(b.shots, b.name+"-"+name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Errorf("write screenshot: %v", err)
		return ""
	}
	b.t.Logf("screenshot: %s", p)
	return p
}

// uiAPI calls the API as a client of the server would.
type uiAPI struct {
	t     *testing.T
	base  string
	token string
}

func (a uiAPI) do(method, path, body string, want int, hdr ...string) []byte {
	a.t.Helper()
	if a.token != "" {
		hdr = append(hdr, "Authorization", "Bearer "+a.token)
	}
	code, b := restDo(a.t, method, a.base+path, body, hdr...)
	// Sent again while the cluster has no leader (not carried out: a
	// loaded machine's election met a DELETE through the follower).
	for deadline := time.Now().Add(30 * time.Second); code == http.StatusServiceUnavailable &&
		strings.Contains(string(b), string(wire.CodeNoLeader)) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		code, b = restDo(a.t, method, a.base+path, body, hdr...)
	}
	if code != want {
		a.t.Fatalf("%s %s: %d %s, want %d", method, path, code, b, want)
	}
	return b
}

func (a uiAPI) acquire(key, holder string, ttl time.Duration) *wire.Lease {
	a.t.Helper()
	b := a.do("POST", "/v1/leases", fmt.Sprintf(`{"key":%q,"holder":%q,"ttl_ms":%d}`, key, holder, ttl.Milliseconds()), http.StatusCreated)
	var l wire.Lease
	if err := json.Unmarshal(b, &l); err != nil {
		a.t.Fatal(err)
	}
	return &l
}

func (a uiAPI) release(l *wire.Lease) {
	a.t.Helper()
	a.do("DELETE", "/v1/leases/"+l.LeaseID, "", http.StatusOK, headerLeaseToken, l.Token)
}

// row is a JavaScript expression for the leases table's row of a lease.
func row(l *wire.Lease) string {
	return fmt.Sprintf(`document.querySelector('#lease-table tr[data-lease=%q]')`, l.LeaseID)
}

// feedHas is a JavaScript condition: the live feed shows an event of type
// typ for the lease.
func feedHas(typ string, l *wire.Lease) string {
	return fmt.Sprintf(`document.querySelector('#feed li[data-type=%q][data-lease=%q]')`, typ, l.LeaseID)
}

// exerciseConsole opens the console at base, acquires, releases and lets a
// lease expire through api, and checks that the page shows each change
// without a reload. members is the cluster's size.
func exerciseConsole(t *testing.T, b *browser, base string, a uiAPI, members int) {
	if _, err := run(b, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("open %s/: %v", base, err)
	}
	if got, err := run(b, chromedp.Location()); err != nil || got != base+"/ui/" {
		t.Fatalf("GET / led to %q (%v), want %s/ui/", got, err, base)
	}
	b.waitFor("the cluster panel", fmt.Sprintf(
		`document.querySelectorAll('#members tbody tr').length === %d && document.getElementById('c-leader').textContent.length > 1`, members))
	b.waitFor("the live stream connected", `document.getElementById('stream-state').textContent === 'live'`)
	b.waitFor("the control lease status", `document.getElementById('ctl-state').textContent === 'free'`)
	// Every state, so that ended leases stay in the table.
	eval[bool](b, `(() => { const s = document.getElementById('f-state'); s.value = ''; s.dispatchEvent(new Event('change')); return true })()`)

	// Acquired: the row appears, active, with holder and fencing token, and
	// its remaining time counts down.
	held := a.acquire("ui/orders", "worker-1", time.Minute)
	b.waitFor("the acquired lease", fmt.Sprintf(`(r => r && r.dataset.state === 'active' && r.innerText.includes('worker-1') && r.innerText.includes(%q))(%s)`,
		strconv.FormatUint(held.FencingToken, 10), row(held)))
	b.waitFor("the acquire in the event feed", feedHas("acquired", held))
	first := eval[string](b, row(held)+`.querySelector('.remaining').textContent`)
	b.waitFor("the remaining time counting down", fmt.Sprintf(`(t => t && t !== %q && parseFloat(t) < 60)(%s.querySelector('.remaining').textContent)`, first, row(held)))
	b.shot("acquired")

	// Released.
	a.release(held)
	b.waitFor("the released lease", fmt.Sprintf(`%s.dataset.state === 'released'`, row(held)))
	b.waitFor("the release in the event feed", feedHas("released", held))

	// Expired: a short lease nobody renews.
	short := a.acquire("ui/short", "worker-2", 1500*time.Millisecond)
	b.waitFor("the short lease", fmt.Sprintf(`(r => r && r.dataset.state === 'active')(%s)`, row(short)))
	b.waitFor("the expired lease", fmt.Sprintf(`%s.dataset.state === 'expired'`, row(short)))
	b.waitFor("the expiry in the event feed", feedHas("expired", short))

	// Taken after an involuntary end: the history calls it stolen.
	next := a.acquire("ui/short", "worker-3", time.Minute)
	b.waitFor("the next holder", fmt.Sprintf(`(r => r && r.dataset.state === 'active')(%s)`, row(next)))
	eval[bool](b, row(next)+`.querySelector('a.key').click() || true`)
	b.waitFor("the key's history", fmt.Sprintf(`(() => {
		const types = [...document.querySelectorAll('#timeline li')].map(li => li.dataset.type + ':' + li.dataset.lease);
		return types.join(',') === ['acquired:%s', 'expired:%s', 'stolen:%s'].join(',');
	})()`, short.LeaseID, short.LeaseID, next.LeaseID))
	b.waitFor("the session-free sessions table", `document.getElementById('session-empty').hidden === false`)
}

// TestConsoleSingleServer: one server with auth on. The console loads
// without a token, reads nothing until one is given, never shows it back,
// shows every change live, and offers revoke to the admin scope only.
func TestConsoleSingleServer(t *testing.T) {
	path := needChromium(t)
	env := newControlEnv(t, Options{Tokens: testTokens(t)})
	b := newBrowser(t, path, "single")
	base := env.srv.URL

	// The static files need no token, the data routes do.
	for _, p := range []string{"/ui/", "/ui/app.js", "/ui/style.css"} {
		if code, body := restDo(t, "GET", base+p, ""); code != http.StatusOK || len(body) == 0 {
			t.Fatalf("GET %s without a token: %d", p, code)
		}
	}
	if code, _ := restDo(t, "GET", base+"/v1/leases", ""); code != http.StatusUnauthorized {
		t.Fatalf("GET /v1/leases without a token: %d, want 401", code)
	}

	if _, err := run(b, chromedp.Navigate(base+"/ui/")); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the request for a token", `document.getElementById('banner').innerText.includes('requires a bearer token')`)
	if _, err := run(b, chromedp.SendKeys(chromedp.ID("token-input"), adminToken)); err != nil {
		t.Fatal(err)
	}
	if _, err := run(b, chromedp.Click(chromedp.ID("token-use"))); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the admin scope", `document.getElementById('whoami').textContent === 'token ops · admin'`)

	a := uiAPI{t: t, base: base, token: writeToken}
	exerciseConsole(t, b, base, a, 1)

	// The token is kept for the tab but never written into the page.
	checkNoToken := func(tok string) {
		t.Helper()
		if html := eval[string](b, `document.documentElement.outerHTML + document.getElementById('token-input').value`); strings.Contains(html, tok) {
			t.Fatalf("the page shows the bearer token")
		}
	}
	checkNoToken(adminToken)

	// Revoke, behind a confirmation.
	victim := a.acquire("ui/victim", "worker-4", time.Minute)
	b.waitFor("the lease to revoke", fmt.Sprintf(`%s && %s.querySelector('button[data-revoke]')`, row(victim), row(victim)))
	eval[bool](b, `(() => { window.__asked = []; window.confirm = q => { window.__asked.push(q); return true }; return true })()`)
	eval[bool](b, row(victim)+`.querySelector('button[data-revoke]').click() || true`)
	b.waitFor("the revoked lease", fmt.Sprintf(`%s.dataset.state === 'revoked'`, row(victim)))
	b.waitFor("the revoke in the event feed", feedHas("revoked", victim))
	if asked := eval[[]string](b, `window.__asked`); len(asked) != 1 || !strings.Contains(asked[0], victim.LeaseID) {
		t.Fatalf("confirmations asked: %q", asked)
	}
	// While the control lease is held, the panel shows its owner and
	// countdown, and an admin action the gate refuses is explained.
	ws := dialControl(t, base, http.Header{"Authorization": {"Bearer " + writeToken}})
	acquire(t, ws, "ops-console-test", "ttlMs", 60000)
	b.waitFor("the control lease held", `document.getElementById('ctl-state').textContent === 'held' &&
		document.getElementById('ctl-owner').textContent.startsWith('ops-console-test') &&
		parseFloat(document.getElementById('ctl-remaining').textContent) > 0`)
	gated := a.acquire("ui/gated", "worker-6", time.Minute)
	b.waitFor("the lease to try to revoke", fmt.Sprintf(`%s && %s.querySelector('button[data-revoke]')`, row(gated), row(gated)))
	eval[bool](b, row(gated)+`.querySelector('button[data-revoke]').click() || true`)
	b.waitFor("the refusal explained", `document.getElementById('banner').innerText.includes('the control lease is active')`)
	b.shot("control-held")
	eval[bool](b, `document.querySelector('#banner .dismiss').click() || true`)
	b.waitFor("the message dismissed", `document.getElementById('banner').hidden`)
	ws.c.Close(websocket.StatusNormalClosure, "done")
	b.waitFor("the control lease free again", `document.getElementById('ctl-state').textContent === 'free'`)
	if st := eval[string](b, row(gated)+`.dataset.state`); st != "active" {
		t.Fatalf("a revoke the control lease refused left the lease %s", st)
	}

	// A session with a bound lease shows in the sessions table.
	var sess wire.Session
	if err := json.Unmarshal(a.do("POST", "/v1/sessions", `{"holder":"worker-5","ttl_ms":60000}`, http.StatusCreated), &sess); err != nil {
		t.Fatal(err)
	}
	var bound wire.Lease
	if err := json.Unmarshal(a.do("POST", "/v1/leases", `{"key":"ui/bound","holder":"worker-5","session_id":"`+sess.SessionID+`"}`,
		http.StatusCreated, headerSessionToken, sess.Token), &bound); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the session with its lease", fmt.Sprintf(`(r => r && r.innerText.includes('ui/bound') && r.innerText.includes(%q))(document.querySelector('#session-table tr[data-session=%q]'))`,
		bound.LeaseID, sess.SessionID))
	laptop := b.shot("laptop")
	if os.Getenv("LEASEHOLD_UI_UPDATE_DOCS") != "" && laptop != "" {
		data, err := os.ReadFile(laptop)
		if err == nil {
			err = os.WriteFile(filepath.Join("..", "docs", "console.png"), data, 0o644)
		}
		if err != nil {
			t.Fatalf("update docs/console.png: %v", err)
		}
	}
	if _, err := run(b, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile)); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the phone layout", `getComputedStyle(document.querySelector('#lease-table thead')).display === 'none'`)
	b.shot("phone")
	if _, err := run(b, chromedp.EmulateReset()); err != nil {
		t.Fatal(err)
	}

	// A read-scope token sees everything and is offered no admin action;
	// the revoke it is not offered would be refused anyway.
	eval[bool](b, `(() => { document.getElementById('token-forget').click(); return true })()`)
	b.waitFor("the token forgotten", `document.getElementById('whoami').textContent === 'no token'`)
	if _, err := run(b, chromedp.SendKeys(chromedp.ID("token-input"), readToken)); err != nil {
		t.Fatal(err)
	}
	if _, err := run(b, chromedp.Click(chromedp.ID("token-use"))); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the read scope", `document.getElementById('whoami').textContent === 'token reader · read'`)
	b.waitFor("the leases read with the read token", fmt.Sprintf(`(r => r && r.dataset.state === 'active')(%s)`, row(&bound)))
	if n := eval[int](b, `document.querySelectorAll('button[data-revoke], button.danger').length`); n != 0 {
		t.Fatalf("a read-scope token is offered %d admin actions", n)
	}
	checkNoToken(readToken)
}

// TestConsoleThroughFollower: the console served by a follower of three
// servers shows the cluster and every change (its reads go to the leader,
// its event stream is the follower's own).
func TestConsoleThroughFollower(t *testing.T) {
	path := needChromium(t)
	ms := startAPICluster(t)
	b := newBrowser(t, path, "follower")
	var follower *clusterMember
	for _, m := range ms {
		if info, ok := m.Node.Leader(); ok && !info.Self {
			follower = m
			break
		}
	}
	if follower == nil {
		t.Fatal("no follower")
	}
	t.Logf("console through follower %s", follower.ID)
	exerciseConsole(t, b, follower.Addr, uiAPI{t: t, base: follower.Addr}, 3)
	b.waitFor("the follower's own view", fmt.Sprintf(`document.getElementById('c-node').textContent.startsWith(%q)`, follower.ID+" (follower"))
	b.waitFor("every member healthy", `[...document.querySelectorAll('#members .health')].every(e => e.textContent === 'healthy')`)
	b.shot("cluster")
}
