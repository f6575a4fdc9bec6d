package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
)

// chromium runs Debian's headless Chromium with a new empty profile on
// one page and returns what it printed (--dump-dom: the DOM after the
// page loaded and any redirects). On a loaded machine Chromium now and
// then never finishes, or prints before the one-time link's redirect
// landed: it is killed after 2 minutes, and run again with a new profile
// while ok (when set) refuses what it printed, 3 times at most; open
// (when set) makes it a new page to open each time.
func (l *lab) chromium(bin, profile string, open func() string, ok func(string) bool, args ...string) string {
	l.t.Helper()
	var err error
	var errOut strings.Builder
	for attempt := 1; attempt <= 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--user-data-dir=" + filepath.Join(l.root, fmt.Sprintf("%s-%d", profile, attempt))}
		all := append(flags, args...)
		if open != nil {
			all = append(all, open())
		}
		cmd := exec.CommandContext(ctx, bin, all...)
		cmd.Env = append(os.Environ(), "HOME="+l.root)
		errOut.Reset()
		cmd.Stderr = &errOut
		var out []byte
		out, err = cmd.Output()
		cancel()
		if err == nil && (ok == nil || ok(string(out)) || attempt == 3) {
			return string(out)
		}
		if err == nil {
			err = errors.New("not the page yet")
		}
		l.t.Logf("chromium %v, attempt %d: %v", args, attempt, err)
	}
	l.t.Fatalf("chromium %v: %v\n%s", args, err, errOut.String())
	return ""
}

// TestFleetPage: the fleet page, opened in headless Chromium through a
// one-time link, shows 3 fakehw nodes with their 8 GPUs each, a hold and
// a command's result, and is written as bin/fleet-page.png; without the
// admin token (no bearer, a wrong one, a spent link, a made-up cookie)
// it is refused, and its cookie never opens the API.
func TestFleetPage(t *testing.T) {
	chrome := testenv.NeedTool(t, "chromium", "chromium")
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	admin := g.waitLog(t, "bcgw serving", time.Second)["admin_url"].(string)
	ids := l.threeNodes(g)
	l.bcgw(g, "hold", ids[0], "--alloc", "alloc_page", "--gpu", "3")
	code, ping := l.runKind(g, ids[1], "agent.ping", "")
	if code != 0 || ping.Status != "SUCCEEDED" {
		t.Fatalf("agent.ping: exit %d %+v", code, ping)
	}
	tok, err := os.ReadFile(filepath.Join(gwDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	get := func(hc *http.Client, path, bearer string, cookie *http.Cookie) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, admin+path, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		if cookie != nil {
			req.AddCookie(cookie)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	// Wait until every node's inventory and the hold show (reports come
	// after the session and the spec).
	want := "3 nodes, 24 GPUs, 1 held."
	end := time.Now().Add(60 * time.Second)
	for {
		_, body := get(http.DefaultClient, "/fleet", strings.TrimSpace(string(tok)), nil)
		if strings.Contains(body, want) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the page never said %q:\n%s", want, body)
		}
		time.Sleep(250 * time.Millisecond)
	}

	// Refused without the token, and the refusal shows no node.
	for _, c := range []struct {
		name   string
		path   string
		bearer string
		cookie *http.Cookie
	}{
		{"no token", "/fleet", "", nil},
		{"a wrong bearer", "/fleet", "not-the-token", nil},
		{"a made-up cookie", "/fleet", "", &http.Cookie{Name: "bcgw_page", Value: "madeup"}},
		{"a made-up link", "/fleet/login?code=madeup", "", nil},
	} {
		code, body := get(http.DefaultClient, c.path, c.bearer, c.cookie)
		if code != http.StatusUnauthorized || strings.Contains(body, ids[0]) || !strings.Contains(body, "needs the admin token") {
			t.Errorf("%s: %d %s", c.name, code, body)
		}
	}
	if dom := l.chromium(chrome, "profile-refused", nil, nil, "--dump-dom", admin+"/fleet"); strings.Contains(dom, ids[0]) || !strings.Contains(dom, "needs the admin token") {
		t.Errorf("Chromium without a link got:\n%s", dom)
	}

	// A link opens the page once; its cookie opens the page, not the API.
	var link struct{ URL string }
	if err := json.Unmarshal([]byte(l.bcgw(g, "page", "--json")), &link); err != nil {
		t.Fatal(err)
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar}
	if code, body := get(hc, strings.TrimPrefix(link.URL, admin), "", nil); code != 200 || !strings.Contains(body, want) {
		t.Fatalf("the link: %d %s", code, body)
	}
	if code, _ := get(hc, strings.TrimPrefix(link.URL, admin), "", nil); code != http.StatusUnauthorized {
		t.Errorf("the link a second time: %d", code)
	}
	var session *http.Cookie
	u, err := url.Parse(admin + "/fleet")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range jar.Cookies(u) {
		if c.Name == "bcgw_page" {
			session = c
		}
	}
	if session == nil {
		t.Fatal("the link set no bcgw_page cookie")
	}
	if code, _ := get(http.DefaultClient, "/v1/nodes", "", session); code != http.StatusUnauthorized {
		t.Errorf("the page's cookie opened the API: %d", code)
	}

	// Chromium, given only a file that sends it on to a new link (the
	// link is not in its arguments).
	htmlFile := filepath.Join(l.root, "open-page.html")
	open := func() string {
		_ = os.Remove(htmlFile)
		l.bcgw(g, "page", "--html", htmlFile)
		return "file://" + htmlFile
	}
	isPage := func(dom string) bool { return strings.Contains(dom, "<h1>bcgw fleet</h1>") }
	dom := l.chromium(chrome, "profile-dom", open, isPage, "--virtual-time-budget=3000", "--dump-dom")
	for _, s := range append([]string{want, "alloc_page", ping.ID, "SUCCEEDED", `"node_id":"` + ids[1] + `"`}, ids...) {
		if !strings.Contains(dom, s) {
			t.Errorf("the page in Chromium lacks %q", s)
		}
	}
	if n := len(regexp.MustCompile(`<td class="mono">GPU-`).FindAllString(dom, -1)); n != 24 {
		t.Errorf("the page in Chromium shows %d GPU rows, want 24", n)
	}
	if n := strings.Count(dom, `<td class="held">alloc_page</td>`); n != 1 {
		t.Errorf("the page in Chromium shows the hold on %d GPUs, want 1", n)
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}
	shot, err := filepath.Abs(filepath.Join("..", "bin", "fleet-page.png"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(shot), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(shot)
	// The screenshot, for a person to look at, is of the DOM Chromium
	// built from the live page above (its refresh taken out), opened as a
	// file: a screenshot of the live page through the link's redirects
	// and --virtual-time-budget hung Chromium now and then when the e2e
	// tier ran beside it (killed after 2 minutes, 3 times in a row in one
	// CI run). The page's 24 GPU rows and its tables ink hundreds of
	// pixel rows.
	snap := filepath.Join(l.root, "fleet-page.html")
	static := regexp.MustCompile(`<meta http-equiv="refresh"[^>]*>`).ReplaceAllString(dom, "")
	if err := os.WriteFile(snap, []byte(static), 0o644); err != nil {
		t.Fatal(err)
	}
	inked := func(string) bool { return inkedRows(t, shot) >= 600 }
	l.chromium(chrome, "profile-shot", nil, inked, "--window-size=1400,2400", "--hide-scrollbars",
		"--screenshot="+shot, "file://"+snap)
	if n := inkedRows(t, shot); n < 600 {
		t.Errorf("screenshot %s: %d pixel rows have ink; the page was not in it", shot, n)
	}
	t.Logf("the fleet page: %s", shot)
}

// inkedRows counts the pixel rows of a PNG with anything but white.
func inkedRows(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Logf("screenshot %s: %v", path, err)
		return 0
	}
	inked := 0
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
			if r, g, b, _ := img.At(x, y).RGBA(); r < 0xe000 || g < 0xe000 || b < 0xe000 {
				inked++
				break
			}
		}
	}
	return inked
}
