package nongpu

import (
	"fmt"
	"strconv"

	"kvdock/core/l1"
	"kvdock/core/workers"
	"kvdock/settings"
)

// PlanSegment is the seed decision, made once before the pool exists, from
// server.shm_name and the L1 settings: the segment l1.Open is to create
// (Segment, normalised) and why (Reason). With --shm-name "" (pickle
// mode) the pool is not shared: it is planned in the private segment of
// this endpoint (Private, never advertised) so that a restart can keep it
// as it keeps a shared one; a lazy pool, and a pool whose private segment
// cannot be made, are anonymous memory, whose restarts are cold. l1.Open
// carries the plan out and completes it with what it mapped, the capacity
// check's fallback included; that final Decision is all PoolInfo reads.
// shmNameSource says where a given --shm-name came from ("on the command
// line", "by KVDOCK_SHM_NAME", "in <file>:<line>"); it is only used in reasons.
func PlanSegment(server settings.ServerConfig, l1cfg settings.L1Config, pid int, shmNameSource string) l1.Decision {
	if server.ShmName == nil {
		if l1cfg.UseLazy {
			return l1.Decision{Reason: "l1.use_lazy is on: a lazy pool cannot be shared"}
		}
		seg := l1.SegmentPrefix + strconv.Itoa(pid)
		return l1.Decision{Segment: seg, Reason: fmt.Sprintf("--shm-name not set: default segment %s for server pid %d", seg, pid)}
	}
	name := *server.ShmName
	if name == "" {
		reason := fmt.Sprintf("--shm-name \"\" given%s", sourceSuffix(shmNameSource))
		if l1cfg.UseLazy {
			return l1.Decision{Reason: reason + "; l1.use_lazy is on: a lazy pool is anonymous memory"}
		}
		return l1.Decision{Private: l1.PrivateSegmentName(server.Host, server.Port), Reason: reason}
	}
	seg := l1.NormalizeName(name)
	if seg == name {
		return l1.Decision{Segment: seg, Reason: fmt.Sprintf("--shm-name %s given%s", name, sourceSuffix(shmNameSource))}
	}
	return l1.Decision{Segment: seg, Reason: fmt.Sprintf("--shm-name %s given%s, normalised to %s", name, sourceSuffix(shmNameSource), seg)}
}

func sourceSuffix(source string) string {
	if source == "" {
		return ""
	}
	return " (" + source + ")"
}

// PoolInfo is what registration advertises for the pool's final decision
// (the plan as l1.Open carried it out): the segment when it exists and is
// shared, so the advertised segment is always the one that exists, and
// never a private segment (Decision.Private, or a private name however it
// got there);
// otherwise {"", 0} with the decision's reason (--shm-name "", lazy pool,
// /dev/shm too small, …).
func PoolInfo(d l1.Decision) workers.Info {
	if d.Shared && d.Segment != "" && d.Size > 0 && !l1.IsPrivateSegment(d.Segment) {
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
