package mockmodel

import (
	"bufio"
	"os"
	"regexp"
	"strings"
)

var (
	inetAddr  = regexp.MustCompile(`sa_family=AF_INET, .*sin_addr=inet_addr\("([^"]+)"\)`)
	inet6Addr = regexp.MustCompile(`sa_family=AF_INET6, .*inet_pton\(AF_INET6, "([^"]+)"`)
	family    = regexp.MustCompile(`sa_family=(AF_[A-Z0-9]+)`)
)

// AuditConnects reads `strace -f -e trace=connect` logs of a real provider
// driven against the mock and returns the number of connect() calls and
// those to anything but loopback or a unix socket (the egress audit of the
// opt-in real-provider suites).
func AuditConnects(files []string) (int, []string, error) {
	n := 0
	var bad []string
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return n, bad, err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, "connect(") {
				continue
			}
			n++
			fam := family.FindStringSubmatch(line)
			switch {
			case fam == nil:
				bad = append(bad, line)
			case fam[1] == "AF_UNIX":
			case fam[1] == "AF_INET":
				if m := inetAddr.FindStringSubmatch(line); m == nil || !strings.HasPrefix(m[1], "127.") {
					bad = append(bad, line)
				}
			case fam[1] == "AF_INET6":
				if m := inet6Addr.FindStringSubmatch(line); m == nil || m[1] != "::1" {
					bad = append(bad, line)
				}
			default:
				bad = append(bad, line)
			}
		}
		err = sc.Err()
		_ = fh.Close()
		if err != nil {
			return n, bad, err
		}
	}
	return n, bad, nil
}
