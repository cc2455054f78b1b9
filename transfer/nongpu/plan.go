package nongpu

import (
	"fmt"
	"strconv"

	"kvdock/core/l1"
	"kvdock/core/workers"
	"kvdock/settings"
)

// PlanSegment is the seed decision made before the pool exists: the segment
// name the engine should ask core/l1 to create ("" = anonymous pool) and why.
// shmNameSource says where a given --shm-name came from ("on the command
// line", "by KVDOCK_SHM_NAME", "in <file>:<line>"); it is only used in reasons.
func PlanSegment(server settings.ServerConfig, l1cfg settings.L1Config, pid int, shmNameSource string) (segment, reason string) {
	if server.ShmName == nil {
		if l1cfg.UseLazy {
			return "", "l1.use_lazy is on: a lazy pool cannot be shared"
		}
		seg := l1.SegmentPrefix + strconv.Itoa(pid)
		return seg, fmt.Sprintf("--shm-name not set: default segment %s for server pid %d", seg, pid)
	}
	name := *server.ShmName
	if name == "" {
		return "", fmt.Sprintf("--shm-name \"\" given%s", sourceSuffix(shmNameSource))
	}
	seg := l1.NormalizeName(name)
	if seg == name {
		return seg, fmt.Sprintf("--shm-name %s given%s", name, sourceSuffix(shmNameSource))
	}
	return seg, fmt.Sprintf("--shm-name %s given%s, normalised to %s", name, sourceSuffix(shmNameSource), seg)
}

func sourceSuffix(source string) string {
	if source == "" {
		return ""
	}
	return " (" + source + ")"
}

// PoolInfo is what registration advertises given the server settings and the
// pool that was actually built. The advertised name is always the segment that
// exists: an explicit --shm-name "" advertises nothing even when the pool
// happens to be shared; otherwise the pool's own decision is advertised when
// it is shared, and {"", 0} with the pool's reason (lazy pool, /dev/shm too
// small, …) when it is not.
func PoolInfo(server settings.ServerConfig, d l1.Decision) workers.Info {
	if server.ShmName != nil && *server.ShmName == "" {
		reason := "--shm-name \"\" given: SHM off, pickle for every worker"
		if !d.Shared && d.Reason != "" {
			reason = d.Reason
		}
		return workers.Info{Reason: reason}
	}
	if d.Shared && d.Segment != "" && d.Size > 0 {
		reason := d.Reason
		if reason == "" {
			reason = fmt.Sprintf("shared segment %s (%d bytes)", d.Segment, d.Size)
		}
		return workers.Info{ShmName: d.Segment, PoolSize: d.Size, Reason: reason}
	}
	reason := d.Reason
	if reason == "" {
		reason = "the L1 pool is not shared"
	}
	return workers.Info{Reason: reason}
}
