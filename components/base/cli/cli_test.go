package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"
)

const secretToken = "bcjt_jt_01abcdefSECRET"

// testProgram is a node build with join, status and a counting command.
func testProgram() *Program {
	join := func(ctx context.Context, env *Env, args []string) int {
		fs := NewFlagSet(env, "bcd", "join")
		fs.String("token-file", "", "read the token from this file")
		fs.String("role", "node", "node or site")
		fs.Int("retries", 3, "attempts")
		if code, ok := Parse(fs, env, args, "bcd join reads the join token from BCD_JOIN_TOKEN, stdin or --token-file, never from arguments"); !ok {
			return code
		}
		env.Stdout.Write([]byte("joined\n"))
		return 0
	}
	status := func(ctx context.Context, env *Env, args []string) int {
		fs := NewFlagSet(env, "bcd", "status")
		asJSON := fs.Bool("json", false, "print JSON")
		if code, ok := Parse(fs, env, args, ""); !ok {
			return code
		}
		if *asJSON {
			env.Stdout.Write([]byte("{}\n"))
		}
		return 0
	}
	fail := func(ctx context.Context, env *Env, args []string) int {
		return Fail(env, "bcd doctor", errors.New("config: missing"))
	}
	return &Program{
		Name: "bcd",
		Role: "node",
		Commands: []Command{
			{Name: "join", Summary: "join the fleet", Run: join},
			{Name: "status", Summary: "ask the running agent", Run: status},
			{Name: "doctor", Summary: "check this machine", Run: fail},
		},
		Documented: map[string]string{
			"sim":  "bcd sim: needs a fakehw build (go build -tags fakehw)",
			"site": "",
			"join": "never printed: this build has join",
		},
		Version: VersionInfo{Version: "0.1.0-dev", Commit: "abc1234", Tags: []string{"fakehw"}},
	}
}

func TestProgramMain(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		wantCode   int
		wantStdout []string // substrings
		wantStderr []string
		exactErr   string // the whole of stderr, when set
		never      []string
	}{
		{name: "no args", args: nil, wantCode: 2, wantStderr: []string{"usage: bcd <command>"}},
		{name: "help", args: []string{"help"}, wantCode: 0, wantStdout: []string{"commands:", "join", "join the fleet", "status", "version", "not in this build: sim, site"}},
		{name: "-h", args: []string{"-h"}, wantCode: 0, wantStdout: []string{"commands:"}},
		{name: "-help", args: []string{"-help"}, wantCode: 0, wantStdout: []string{"commands:"}},
		{name: "--help", args: []string{"--help"}, wantCode: 0, wantStdout: []string{"commands:"}},
		{name: "help for a command", args: []string{"help", "join"}, wantCode: 0, wantStdout: []string{"usage: bcd join", "-token-file"}},
		{name: "help for a secret", args: []string{"help", secretToken}, wantCode: 2, exactErr: "bcd: unknown command\n"},
		{
			name:       "version",
			args:       []string{"version"},
			wantCode:   0,
			wantStdout: []string{"bcd 0.1.0-dev (node) " + runtime.GOOS + "/" + runtime.GOARCH + " " + runtime.Version() + " commit=abc1234 tags=fakehw\n"},
		},
		{name: "--version", args: []string{"--version"}, wantCode: 0, wantStdout: []string{"bcd 0.1.0-dev (node)"}},
		{name: "-version", args: []string{"-version"}, wantCode: 0, wantStdout: []string{"bcd 0.1.0-dev (node)"}},
		{name: "version --json", args: []string{"version", "--json"}, wantCode: 0, wantStdout: []string{`"program":"bcd"`, `"tags":["fakehw"]`}},
		{name: "version -h", args: []string{"version", "-h"}, wantCode: 0, wantStdout: []string{"usage: bcd version", "-json"}},
		{name: "version positional", args: []string{"version", secretToken}, wantCode: 2, wantStderr: []string{"bcd version: takes no positional arguments"}, never: []string{secretToken}},
		{name: "unknown command echoed", args: []string{"frobnicate"}, wantCode: 2, exactErr: "bcd: unknown command \"frobnicate\"\n"},
		{name: "unknown token not echoed", args: []string{secretToken}, wantCode: 2, exactErr: "bcd: unknown command\n"},
		{name: "unknown upper case not echoed", args: []string{"Frobnicate"}, wantCode: 2, never: []string{"Frobnicate"}},
		{name: "unknown long name not echoed", args: []string{strings.Repeat("a", 33)}, wantCode: 2, never: []string{strings.Repeat("a", 33)}},
		{name: "unknown leading flag not echoed", args: []string{"--token=" + secretToken}, wantCode: 2, never: []string{secretToken, "token"}},
		{name: "documented with its line", args: []string{"sim", "--nodes", "5"}, wantCode: 2, exactErr: "bcd sim: needs a fakehw build (go build -tags fakehw)\n"},
		{name: "documented without a line", args: []string{"site"}, wantCode: 2, exactErr: "bcd site: not in this build (node)\n"},
		{name: "documented and present", args: []string{"join"}, wantCode: 0, wantStdout: []string{"joined"}},
		{name: "command failure", args: []string{"doctor"}, wantCode: 1, exactErr: "bcd doctor: config: missing\n"},
		{name: "flags", args: []string{"join", "--role", "site", "-token-file=/tmp/t", "--retries=4"}, wantCode: 0, wantStdout: []string{"joined"}},
		{name: "bool flag", args: []string{"status", "--json"}, wantCode: 0, wantStdout: []string{"{}"}},
		{
			name:       "positional argument not echoed",
			args:       []string{"join", secretToken},
			wantCode:   2,
			exactErr:   "bcd join: takes no positional arguments\nbcd join reads the join token from BCD_JOIN_TOKEN, stdin or --token-file, never from arguments\n",
			wantStderr: nil,
		},
		{name: "positional after --", args: []string{"join", "--", secretToken}, wantCode: 2, wantStderr: []string{"takes no positional arguments"}, never: []string{secretToken}},
		{name: "positional after flags", args: []string{"status", "--json", secretToken}, wantCode: 2, never: []string{secretToken}},
		{name: "unknown flag with secret value", args: []string{"join", "--token=SECRETXYZ"}, wantCode: 2, exactErr: "bcd join: unknown flag --token\n", never: []string{"SECRETXYZ"}},
		{name: "unknown flag not like a flag", args: []string{"join", "-" + secretToken}, wantCode: 2, wantStderr: []string{"bcd join: bad flag\n"}, never: []string{secretToken, "bcjt"}},
		{name: "unknown upper-case flag", args: []string{"join", "-SECRETXYZ"}, wantCode: 2, wantStderr: []string{"bcd join: bad flag\n"}, never: []string{"SECRETXYZ"}},
		{name: "unknown flag after a value", args: []string{"join", "--role", "site", "--tokenx=SECRETXYZ"}, wantCode: 2, wantStderr: []string{"unknown flag --tokenx"}, never: []string{"SECRETXYZ"}},
		{name: "value that looks like a flag", args: []string{"join", "--token-file", "-SECRETXYZ"}, wantCode: 0, wantStdout: []string{"joined"}},
		{name: "bad flag syntax", args: []string{"join", "---SECRETXYZ"}, wantCode: 2, wantStderr: []string{"bcd join: bad flag\n"}, never: []string{"SECRETXYZ"}},
		{name: "bad int value", args: []string{"join", "--retries=SECRETXYZ"}, wantCode: 2, wantStderr: []string{"bcd join: invalid value for flag -retries\n"}, never: []string{"SECRETXYZ"}},
		{name: "bad bool value", args: []string{"status", "--json=SECRETXYZ"}, wantCode: 2, wantStderr: []string{"bcd status: invalid value for flag -json\n"}, never: []string{"SECRETXYZ"}},
		{name: "missing value", args: []string{"join", "--role"}, wantCode: 2, wantStderr: []string{"bcd join: flag -role needs a value"}},
		{name: "-h on a command", args: []string{"join", "-h"}, wantCode: 0, wantStdout: []string{"usage: bcd join [flags]", "-role", "node or site"}},
		{name: "--help on a command", args: []string{"status", "--help"}, wantCode: 0, wantStdout: []string{"-json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := &Env{
				Stdin:    strings.NewReader(""),
				Stdout:   &stdout,
				Stderr:   &stderr,
				Getenv:   func(k string) string { return tt.env[k] },
				Unsetenv: func(string) error { return nil },
			}
			code := testProgram().Main(context.Background(), env, tt.args)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			for _, s := range tt.wantStdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			for _, s := range tt.wantStderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr lacks %q:\n%s", s, stderr.String())
				}
			}
			if tt.exactErr != "" && stderr.String() != tt.exactErr {
				t.Errorf("stderr = %q, want %q", stderr.String(), tt.exactErr)
			}
			for _, s := range tt.never {
				if strings.Contains(stdout.String()+stderr.String(), s) {
					t.Errorf("output echoes %q:\nstdout: %s\nstderr: %s", s, stdout.String(), stderr.String())
				}
			}
		})
	}
}

func TestVersionJSON(t *testing.T) {
	tests := []struct {
		name string
		p    Program
		want versionJSON
	}{
		{
			name: "node",
			p:    Program{Name: "bcd", Role: "node", Version: VersionInfo{Version: "0.1.0", Commit: "abc", Tags: []string{"fakehw", "nonvml"}}},
			want: versionJSON{Program: "bcd", Version: "0.1.0", Commit: "abc", Role: "node", Tags: []string{"fakehw", "nonvml"}},
		},
		{
			name: "bcgw without tags",
			p:    Program{Name: "bcgw"},
			want: versionJSON{Program: "bcgw", Version: "unknown", Tags: []string{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout bytes.Buffer
			env := &Env{Stdout: &stdout, Stderr: &bytes.Buffer{}}
			if code := tt.p.Main(context.Background(), env, []string{"version", "-json"}); code != 0 {
				t.Fatalf("exit code %d", code)
			}
			var got versionJSON
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("output is not JSON: %v: %s", err, stdout.String())
			}
			tt.want.OS, tt.want.Arch, tt.want.Go = runtime.GOOS, runtime.GOARCH, runtime.Version()
			if got.Program != tt.want.Program || got.Version != tt.want.Version || got.Commit != tt.want.Commit ||
				got.Role != tt.want.Role || got.OS != tt.want.OS || got.Arch != tt.want.Arch || got.Go != tt.want.Go ||
				strings.Join(got.Tags, ",") != strings.Join(tt.want.Tags, ",") || got.Tags == nil {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestProgramVersionOverride(t *testing.T) {
	p := &Program{Name: "bcgw", Commands: []Command{{Name: "version", Summary: "own", Run: func(context.Context, *Env, []string) int { return 7 }}}}
	var out bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &out}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if code := p.Main(context.Background(), env, args); code != 7 {
			t.Errorf("%v: exit code %d, want the program's own version command", args, code)
		}
	}
	if code := p.Main(context.Background(), env, []string{"help"}); code != 0 || strings.Count(out.String(), "version") != 1 {
		t.Errorf("help lists version %d times:\n%s", strings.Count(out.String(), "version"), out.String())
	}
}

func TestNotInBuildWithoutRole(t *testing.T) {
	p := &Program{Name: "bcgw", Documented: map[string]string{"serve": ""}}
	var stderr bytes.Buffer
	env := &Env{Stdout: &bytes.Buffer{}, Stderr: &stderr}
	if code := p.Main(context.Background(), env, []string{"serve"}); code != 2 || stderr.String() != "bcgw serve: not in this build\n" {
		t.Errorf("code %d, stderr %q", code, stderr.String())
	}
}

func TestMatchers(t *testing.T) {
	tests := []struct {
		s             string
		command, flag bool
	}{
		{"join", true, false},
		{"well-known", true, false},
		{"a", true, false},
		{strings.Repeat("a", 32), true, false},
		{strings.Repeat("a", 33), false, false},
		{"Join", false, false},
		{"join2", false, false},
		{"-join", false, true},
		{"--token=SECRET", false, true},
		{"--token-file", false, true},
		{"-a1", false, true},
		{"---x", false, false},
		{"-", false, false},
		{"--", false, false},
		{"-Token", false, false},
		{"-1x", false, false},
		{"--bcjt_jt_01", false, false},
		{"-" + strings.Repeat("a", 33), false, false},
		{"", false, false},
	}
	for _, tt := range tests {
		if got := looksLikeCommand(tt.s); got != tt.command {
			t.Errorf("looksLikeCommand(%q) = %v", tt.s, got)
		}
		if got := looksLikeFlag(tt.s); got != tt.flag {
			t.Errorf("looksLikeFlag(%q) = %v", tt.s, got)
		}
	}
}

func TestHelpers(t *testing.T) {
	tests := []struct {
		name string
		run  func(env *Env) int
		code int
		err  string
	}{
		{"Fail", func(env *Env) int { return Fail(env, "bcd node", errors.New("agent: not joined")) }, 1, "bcd node: agent: not joined\n"},
		{"Usagef", func(env *Env) int { return Usagef(env, "bcd join: --role is node or site") }, 2, "bcd join: --role is node or site\n"},
		{"Usagef args", func(env *Env) int { return Usagef(env, "bcd sim: --nodes must be at least %d", 1) }, 2, "bcd sim: --nodes must be at least 1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			env := &Env{Stdout: &bytes.Buffer{}, Stderr: &stderr}
			if code := tt.run(env); code != tt.code || stderr.String() != tt.err {
				t.Errorf("code %d stderr %q, want %d %q", code, stderr.String(), tt.code, tt.err)
			}
		})
	}
}
