// Package instance names the running process among its peers.
package instance

import (
	"fmt"
	"os"

	"github.com/bentoevents/bento/aggregate"
)

// ID returns a fresh name for one worker of this process: host, process id
// and a random suffix, so two workers in one process differ too.
func ID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), aggregate.NewID()[20:])
}
