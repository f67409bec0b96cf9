package clustertest

// sysSetns is setns(2), which package syscall does not name.
const sysSetns = 268
