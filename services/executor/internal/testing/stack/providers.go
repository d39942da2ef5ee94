package stack

import (
	"github.com/tether-run/tether/pkg/providerlaunch"
)

// ProviderGatewayArgs are the runnergw flags of a pinned launch profile
// (package providerlaunch): -<name>-command, -<name>-arg for each arg,
// -<name>-version (the build's pin) and -<name>-sha256 of the command,
// hashed now.
func ProviderGatewayArgs(name, command string, args ...string) ([]string, error) {
	sum, err := providerlaunch.FileSHA256(command)
	if err != nil {
		return nil, err
	}
	out := []string{"-" + name + "-command", command, "-" + name + "-version", providerlaunch.Versions[name], "-" + name + "-sha256", sum}
	for _, a := range args {
		out = append(out, "-"+name+"-arg", a)
	}
	return out, nil
}
