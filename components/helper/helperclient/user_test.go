package helperclient

import (
	"errors"
	"os"
	"os/user"
	"strings"
	"testing"
)

func TestCheckNodeUser(t *testing.T) {
	lookup := func(n string) (int, error) {
		if n == "bcd" {
			return 998, nil
		}
		return 0, user.UnknownUserError(n)
	}
	tests := []struct {
		name    string
		euid    int
		user    string
		wantErr string
	}{
		{"the user", 998, "bcd", ""},
		{"root", 0, "bcd", "runs as root, but config.toml has [helper]: start bcd node as bcd (uid 998)"},
		{"another user", 1000, "bcd", "runs as uid 1000, but [helper] user is bcd (uid 998)"},
		{"an unknown user", 998, "nobody-here", "[helper] user nobody-here: user: unknown user nobody-here"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkNodeUser(tt.euid, tt.user, lookup)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	// The real lookup: root is refused by name.
	if os.Geteuid() == 0 {
		if err := CheckNodeUser("root"); err == nil || !strings.Contains(err.Error(), "runs as root") {
			t.Errorf("CheckNodeUser(root) as root: %v", err)
		}
	}
	if err := CheckNodeUser("bcd-no-such-user-q9"); err == nil || !errors.As(err, new(user.UnknownUserError)) {
		t.Errorf("an unknown user: %v", err)
	}
}
