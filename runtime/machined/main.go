// Command machined is Kiln's machine daemon. This is a placeholder until the runtime issue
// lands: it announces itself the way the boot harness waits for, then stays up.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	once := flag.Bool("once", false, "print the ready line and exit (for build tests)")
	flag.Parse()
	fmt.Printf("machined ready: version=%s\n", version)
	if *once {
		return
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}
