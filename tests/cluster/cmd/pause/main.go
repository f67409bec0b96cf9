// Command pause is the sandbox ("pause") process of the test cluster's
// pods: it sleeps until SIGTERM or SIGINT and then exits 0. It is built
// static and packed into the sandbox image by mkimage.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
