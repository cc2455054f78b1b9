// Package tmpfs gives a test a small tmpfs of its own, so that "the
// filesystem is full" can be tested for real rather than faked.
package tmpfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// envInUserNS is set in a test's re-run inside a user namespace.
const envInUserNS = "KVDOCK_TMPFS_IN_USERNS"

// With runs body with dir a tmpfs of size bytes. As root (CI) it mounts one
// directly under t.TempDir(); otherwise it re-runs the test in a new user
// and mount namespace, where an unprivileged user may mount a tmpfs, and
// reports that run. Neither possible: the test fails under CI (a skipped
// test there is a missing one) and skips, saying why, elsewhere.
func With(t *testing.T, size int64, body func(t *testing.T, dir string)) {
	t.Helper()
	dir := t.TempDir()
	err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size))
	if err == nil {
		t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
		body(t, dir)
		return
	}
	if os.Getenv(envInUserNS) != "" {
		t.Fatalf("mount a tmpfs in a user namespace: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envInUserNS+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	out, runErr := cmd.CombinedOutput()
	var exit *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exit) {
		msg := fmt.Sprintf("cannot mount a tmpfs (%v) nor start a user namespace (%v)", err, runErr)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Logf("re-run in a user namespace:\n%s", out)
	if runErr != nil {
		t.Fatalf("the re-run failed: %v", runErr)
	}
	if !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
		t.Fatalf("the re-run in a user namespace did not pass %s", t.Name())
	}
}
