package settings

import (
	"fmt"
	"strings"
	"time"
)

// EnvPrefix starts every environment variable kvdock reads.
const EnvPrefix = "KVDOCK_"

// EnvConfig names the config file when --config is not given.
const EnvConfig = EnvPrefix + "CONFIG"

// AutoText is how Get shows an absent server.shm_name (auto), and the text
// Set accepts to make it absent again. It cannot be a segment name: '(' is
// not allowed there.
const AutoText = "(auto)"

// KeyInfo describes one setting for help screens and the dashboard editor.
type KeyInfo struct {
	Key     string // dotted YAML key: "l1.size_gb"
	Flag    string // flag name without dashes: "l1-size-gb"
	Env     string // environment variable: "KVDOCK_L1_SIZE_GB"
	Kind    string // "string", "int", "int64", "float", "bool", "duration", "optional-string"
	Default string // default as Get shows it
	Help    string // one line
	Class   Class  // what changing it at runtime costs
	// NoFlag is the negating flag ("no-l1-use-lazy") for the bools that have one.
	NoFlag string
	// Secret values are never shown: diffs, /conf, "config show" and the
	// dashboard print Redacted instead (see Shown).
	Secret bool
	// ReadOnly keys are set only by flag, env or file: Set refuses them and
	// the dashboard shows them without an editor (l2.adapters, whose
	// credentials must never reach a saved file).
	ReadOnly bool
	// Choices are the values a string key accepts (any case; Load and Set
	// keep the form listed here), nil for a free string.
	Choices []string
}

// Redacted stands for a secret value that is set.
const Redacted = "(set, redacted)"

// keyDef is one row of the table every other part (flags, env, file,
// validation, diff, rendering) is driven from.
type keyDef struct {
	key, flag, help string
	class           Class
	negatable       bool
	secret          bool
	readOnly        bool
	envName         string              // when not derived from the flag
	field           func(c *Config) any // pointer to the field
	// choices are the accepted values of a string key, in their canonical
	// form: any case is taken and stored as listed; others are refused
	// (before check, which then sees a canonical value).
	choices []string
	check   func(c Config) string
}

// canon puts the value of an enumerated key of c in its canonical form
// when it names a choice in another case.
func (d keyDef) canon(c *Config) {
	p, ok := d.field(c).(*string)
	if !ok {
		return
	}
	for _, ch := range d.choices {
		if strings.EqualFold(*p, ch) {
			*p = ch
			return
		}
	}
}

// verdict is what is wrong with the value of d in c ("" when nothing).
func (d keyDef) verdict(c Config) string {
	if len(d.choices) > 0 {
		p, _ := d.field(&c).(*string)
		if reason := oneOf(*p, d.choices...); reason != "" && d.check == nil {
			return reason + " (any case)"
		}
	}
	if d.check != nil {
		return d.check(c)
	}
	return ""
}

func (d keyDef) env() string {
	if d.envName != "" {
		return d.envName
	}
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(d.flag, "-", "_"))
}

func (d keyDef) group() string { g, _, _ := strings.Cut(d.key, "."); return g }
func (d keyDef) leaf() string  { _, l, _ := strings.Cut(d.key, "."); return l }

// groups in file order.
var groupOrder = [...]string{"server", "l1", "eviction", "l2", "http", "log", "ui", "kv_events"}

// table returns the key table. It is rebuilt per call (it is small) so the
// package keeps no mutable state.
func table() []keyDef {
	return []keyDef{
		{key: "server.host", flag: "host", class: Restart,
			help:  "address the ZMQ server binds",
			field: func(c *Config) any { return &c.Server.Host },
			check: func(c Config) string { return nonEmpty(c.Server.Host) }},
		{key: "server.port", flag: "port", class: Restart,
			help:  "TCP port of the ZMQ server",
			field: func(c *Config) any { return &c.Server.Port },
			check: func(c Config) string { return intRange(c.Server.Port, 1, 65535) }},
		{key: "server.chunk_size", flag: "chunk-size", class: Rebuild,
			help:  "tokens per KV chunk (must match the workers)",
			field: func(c *Config) any { return &c.Server.ChunkSize },
			check: func(c Config) string { return intMin(c.Server.ChunkSize, 1, "must be > 0") }},
		{key: "server.max_workers", flag: "max-workers", class: Restart,
			help:  "base size of both request handler pools",
			field: func(c *Config) any { return &c.Server.MaxWorkers },
			check: func(c Config) string { return intMin(c.Server.MaxWorkers, 1, "must be >= 1") }},
		{key: "server.max_gpu_workers", flag: "max-gpu-workers", class: Restart,
			help:  "size of the per-worker ordered pool (0 = max_workers)",
			field: func(c *Config) any { return &c.Server.MaxGPUWorkers },
			check: func(c Config) string {
				return intMin(c.Server.MaxGPUWorkers, 0, "must be >= 1, or 0 to use server.max_workers")
			}},
		{key: "server.max_cpu_workers", flag: "max-cpu-workers", class: Restart,
			help:  "size of the shared handler pool (0 = max_workers)",
			field: func(c *Config) any { return &c.Server.MaxCPUWorkers },
			check: func(c Config) string {
				return intMin(c.Server.MaxCPUWorkers, 0, "must be >= 1, or 0 to use server.max_workers")
			}},
		{key: "server.hash_algorithm", flag: "hash-algorithm", class: Rebuild,
			help:    `token chunk hash; only "blake3"`,
			field:   func(c *Config) any { return &c.Server.HashAlgorithm },
			choices: []string{"blake3"},
			check: func(c Config) string {
				if c.Server.HashAlgorithm != "blake3" {
					return `only "blake3" is supported (kvdock does not implement LMCache's other hash algorithms)`
				}
				return ""
			}},
		{key: "server.transfer_mode", flag: "transfer-mode", class: Restart,
			help:    `how KV data moves; only "non_gpu"`,
			field:   func(c *Config) any { return &c.Server.TransferMode },
			choices: []string{"non_gpu"},
			check: func(c Config) string {
				switch c.Server.TransferMode {
				case "non_gpu":
					return ""
				case "gpu":
					return `CUDA IPC transfer is not served by kvdock; run LMCache's own server for CUDA workers (accepted: "non_gpu")`
				}
				return `accepted: "non_gpu"`
			}},
		{key: "server.shm_name", flag: "shm-name", class: Rebuild,
			help:  `shared-memory segment name; "" = SHM off (pickle fallback); unset = auto`,
			field: func(c *Config) any { return &c.Server.ShmName },
			check: func(c Config) string { return checkShmName(c.Server.ShmName) }},
		{key: "server.protocol", flag: "protocol", class: Restart,
			help:    "wire protocol profile: nongpu-v1, nongpu-v2, engine-driven, engine-driven-v2-early, engine-driven-v2, rpc-messages, or auto (detected per worker)",
			field:   func(c *Config) any { return &c.Server.Protocol },
			choices: append(ProtocolProfiles(), ProtocolAuto)},
		{key: "server.protocol_auto_default", flag: "protocol-auto-default", class: Restart,
			help:    "with --protocol auto: the profile an ambiguous worker message is read under, and the one kvdock ctl speaks",
			field:   func(c *Config) any { return &c.Server.ProtocolAutoDefault },
			choices: ProtocolProfiles()},
		{key: "server.max_message_bytes", flag: "max-message-bytes", class: Restart,
			help:  "largest ZMQ message accepted, in bytes",
			field: func(c *Config) any { return &c.Server.MaxMessageBytes },
			check: func(c Config) string {
				if c.Server.MaxMessageBytes < 1<<20 {
					return "must be >= 1048576 (1 MiB)"
				}
				return ""
			}},
		{key: "server.max_instances", flag: "max-instances", class: Live,
			help:  "most worker instances registered at once; more are refused",
			field: func(c *Config) any { return &c.Server.MaxInstances },
			check: func(c Config) string { return intRange(c.Server.MaxInstances, 1, 1<<20) }},
		{key: "server.max_tokens_per_request", flag: "max-tokens-per-request", class: Restart,
			help:  "most token ids one request's key may carry (checked before decoding them)",
			field: func(c *Config) any { return &c.Server.MaxTokensPerRequest },
			check: func(c Config) string {
				if n := c.Server.MaxTokensPerRequest; n < 1 || n > 1<<27 {
					return "must be between 1 and 134217728"
				}
				return ""
			}},
		{key: "server.worker_reap_timeout_seconds", flag: "worker-reap-timeout-seconds", class: Live,
			help:  "seconds of silence after which a worker that pinged with its id and transferred is reaped (engine-driven profile); 0 = never",
			field: func(c *Config) any { return &c.Server.WorkerReapTimeoutSeconds },
			check: func(c Config) string {
				if v := c.Server.WorkerReapTimeoutSeconds; v != 0 && !(v >= 1 && v <= 7*86400) {
					return "must be 0 (no reaping) or between 1 and 604800"
				}
				return ""
			}},
		{key: "server.worker_registration_grace_seconds", flag: "worker-registration-grace-seconds", class: Live,
			help:  "seconds of silence after which a worker that has not both pinged and transferred is reaped; >= the reap timeout",
			field: func(c *Config) any { return &c.Server.WorkerRegistrationGraceSeconds },
			check: func(c Config) string {
				v := c.Server.WorkerRegistrationGraceSeconds
				if !(v >= 1 && v <= 7*86400) {
					return "must be between 1 and 604800"
				}
				if v < c.Server.WorkerReapTimeoutSeconds {
					return fmt.Sprintf("must be >= server.worker_reap_timeout_seconds (%g)", c.Server.WorkerReapTimeoutSeconds)
				}
				return ""
			}},
		{key: "server.worker_idle_seconds", flag: "worker-idle-seconds", class: Live,
			help:  "seconds of silence after which a worker context shows as idle (never reaped for it); 0 = never",
			field: func(c *Config) any { return &c.Server.WorkerIdleSeconds },
			check: func(c Config) string {
				if v := c.Server.WorkerIdleSeconds; !(v >= 0 && v <= 7*86400) {
					return "must be between 0 and 604800"
				}
				return ""
			}},
		{key: "server.queued_request_bytes", flag: "queued-request-bytes", class: Restart,
			help:  "payload bytes of requests queued for the workers, in total (a quarter per peer); over it the server stops reading",
			field: func(c *Config) any { return &c.Server.QueuedRequestBytes },
			check: func(c Config) string {
				if c.Server.QueuedRequestBytes < 1<<20 {
					return "must be >= 1048576 (1 MiB)"
				}
				return ""
			}},
		{key: "server.queued_reply_bytes_per_peer", flag: "queued-reply-bytes-per-peer", class: Restart,
			help:  "bytes of replies kept for one peer that does not read them (8x in total); past it its replies are dropped",
			field: func(c *Config) any { return &c.Server.QueuedReplyBytesPerPeer },
			check: func(c Config) string {
				if c.Server.QueuedReplyBytesPerPeer < 1<<20 {
					return "must be >= 1048576 (1 MiB)"
				}
				return ""
			}},
		{key: "server.max_inflight_pickle_mb", flag: "max-inflight-pickle-mb", class: Restart,
			help:  "MiB of pickled chunks in flight: frames of 1 MiB or more held from their receive until stored (over it the server reads no further request), and the pickle stores and retrieve replies admitted at once (past it a pickle PREPARE_STORE or PREPARE_RETRIEVE waits)",
			field: func(c *Config) any { return &c.Server.MaxInflightPickleMB },
			check: func(c Config) string { return intRange(c.Server.MaxInflightPickleMB, 1, 1<<20) }},
		{key: "server.go_memory_limit_mb", flag: "go-memory-limit-mb", class: NextStart,
			help:  "Go heap soft limit in MiB (GOMEMLIMIT); 0 derives it: 64 MiB + 2 x max-inflight-pickle-mb (the pool is mapped outside the Go heap)",
			field: func(c *Config) any { return &c.Server.GoMemoryLimitMB },
			check: func(c Config) string { return intRange(c.Server.GoMemoryLimitMB, 0, 1<<24) }},
		{key: "server.state_dir", flag: "state-dir", class: Restart,
			help:  "directory (mode 0700, ours) for state that outlives the process, the kept pool's record; empty = $XDG_STATE_HOME/kvdock or ~/.local/state/kvdock",
			field: func(c *Config) any { return &c.Server.StateDir },
			check: func(c Config) string {
				if d := c.Server.StateDir; d != "" && !strings.HasPrefix(d, "/") {
					return "must be an absolute path, or empty for the default"
				}
				return ""
			}},
		{key: "l1.size_gb", flag: "l1-size-gb", class: Rebuild,
			help:  "L1 pool size in GiB",
			field: func(c *Config) any { return &c.L1.SizeGB },
			check: checkSize},
		{key: "l1.use_lazy", flag: "l1-use-lazy", class: Rebuild, negatable: true,
			help:  "lazy L1 allocation (workers then use the pickle fallback)",
			field: func(c *Config) any { return &c.L1.UseLazy }},
		{key: "l1.align_bytes", flag: "l1-align-bytes", class: Rebuild,
			help:  "alignment of every object in the pool, a power of two",
			field: func(c *Config) any { return &c.L1.AlignBytes },
			check: func(c Config) string {
				if a := c.L1.AlignBytes; a < 1 || a&(a-1) != 0 {
					return "must be a power of two >= 1"
				}
				return ""
			}},
		{key: "l1.write_ttl_seconds", flag: "l1-write-ttl-seconds", class: Live,
			help:  "seconds a write reservation may stay uncommitted",
			field: func(c *Config) any { return &c.L1.WriteTTLSeconds },
			check: func(c Config) string { return intMin(c.L1.WriteTTLSeconds, 1, "must be > 0") }},
		{key: "l1.read_ttl_seconds", flag: "l1-read-ttl-seconds", class: Live,
			help:  "seconds a read lock may be held",
			field: func(c *Config) any { return &c.L1.ReadTTLSeconds },
			check: func(c Config) string { return intMin(c.L1.ReadTTLSeconds, 1, "must be > 0") }},
		{key: "l1.prefault", flag: "l1-prefault", class: Rebuild, negatable: true,
			help:  "touch every pool page at start so first writes do not fault",
			field: func(c *Config) any { return &c.L1.Prefault }},
		{key: "l1.allow_overcommit", flag: "l1-allow-overcommit", class: Live, negatable: true,
			help:  "accept a pool larger than the host's available memory (it may then run out of memory)",
			field: func(c *Config) any { return &c.L1.AllowOvercommit }},
		{key: "l1.max_locked_share_per_instance", flag: "l1-max-locked-share-per-instance", class: Live,
			help:  "share of the pool one worker instance (or all lookups together) may hold locked",
			field: func(c *Config) any { return &c.L1.MaxLockedSharePerInstance },
			check: func(c Config) string { return fraction(c.L1.MaxLockedSharePerInstance) }},
		{key: "l1.max_locked_share", flag: "l1-max-locked-share", class: Live,
			help:  "share of the pool all instances and lookups together may hold locked",
			field: func(c *Config) any { return &c.L1.MaxLockedShare },
			check: func(c Config) string { return fraction(c.L1.MaxLockedShare) }},
		{key: "l1.keep_on_exit", flag: "l1-keep-on-exit", class: Restart, negatable: true,
			help:  "on SIGTERM/SIGINT keep the pool's segment and record its state, so the next start adopts the cache",
			field: func(c *Config) any { return &c.L1.KeepOnExit }},
		{key: "eviction.policy", flag: "eviction-policy", class: Live,
			help:    "L1 eviction policy: prefix (prompt-tree leaves, the one predicted to be reused last first), LRU or noop",
			field:   func(c *Config) any { return &c.Eviction.Policy },
			choices: []string{"LRU", "prefix", "noop"}},
		{key: "eviction.trigger_watermark", flag: "eviction-trigger-watermark", class: Live,
			help:  "pool usage fraction that starts eviction",
			field: func(c *Config) any { return &c.Eviction.TriggerWatermark },
			check: func(c Config) string { return fraction(c.Eviction.TriggerWatermark) }},
		{key: "eviction.ratio", flag: "eviction-ratio", class: Live,
			help:  "fraction of the pool one eviction round frees",
			field: func(c *Config) any { return &c.Eviction.Ratio },
			check: func(c Config) string { return fraction(c.Eviction.Ratio) }},
		{key: KeyAdapters, flag: "l2-adapter", envName: EnvPrefix + "L2_ADAPTERS", class: Restart, readOnly: true,
			help:  `an L2 tier as JSON, repeatable, first = tried first: {"type": "fs", "base_path": "/data/l2"} or {"type": "resp", "host": "redis", "port": 6379}; the env var takes a JSON array`,
			field: func(c *Config) any { return &c.L2.Adapters }},
		{key: "l2.store_policy", flag: "l2-store-policy", class: Restart,
			help:    "write-behind: published L1 chunks are copied to the tiers in the background; none: tiers are only read",
			field:   func(c *Config) any { return &c.L2.StorePolicy },
			choices: []string{"write-behind", "none"}},
		{key: "l2.prefetch_max_in_flight", flag: "l2-prefetch-max-in-flight", class: Restart,
			help:  "tier loads into L1 in flight at once",
			field: func(c *Config) any { return &c.L2.PrefetchMaxInFlight },
			check: func(c Config) string { return intRange(c.L2.PrefetchMaxInFlight, 1, 1024) }},
		{key: "l2.load_timeout_seconds", flag: "l2-prefetch-load-timeout", class: Restart,
			help:  "seconds a lookup waits on the tiers before counting fewer hits",
			field: func(c *Config) any { return &c.L2.LoadTimeoutSeconds },
			check: func(c Config) string {
				if v := c.L2.LoadTimeoutSeconds; !(v > 0) || v > 3600 {
					return "must be > 0 and <= 3600"
				}
				return ""
			}},
		{key: "l2.queue_bytes", flag: "l2-queue-bytes", class: Restart,
			help:  "bytes of chunks queued for the tiers; past it writes are dropped and counted",
			field: func(c *Config) any { return &c.L2.QueueBytes },
			check: func(c Config) string {
				if c.L2.QueueBytes < 1<<20 {
					return "must be >= 1048576 (1 MiB)"
				}
				return ""
			}},
		{key: "http.host", flag: "http-host", class: Restart,
			help:  "address of the operator HTTP API",
			field: func(c *Config) any { return &c.HTTP.Host }},
		{key: "http.port", flag: "http-port", class: Restart,
			help:  "port of the operator HTTP API (0 disables it)",
			field: func(c *Config) any { return &c.HTTP.Port },
			check: func(c Config) string { return intRange(c.HTTP.Port, 0, 65535) }},
		{key: "http.token", flag: "http-token", class: Restart, secret: true,
			help:  "bearer token the HTTP API requires for changes (empty = none); pass it by KVDOCK_HTTP_TOKEN or the file, a flag shows in ps",
			field: func(c *Config) any { return &c.HTTP.Token }},
		{key: "log.level", flag: "log-level", class: Live,
			help:    "log level: debug, info, warn or error",
			field:   func(c *Config) any { return &c.Log.Level },
			choices: []string{"debug", "info", "warn", "error"}},
		{key: "log.format", flag: "log-format", class: NextStart,
			help:    "log format: text or json",
			field:   func(c *Config) any { return &c.Log.Format },
			choices: []string{"text", "json"}},
		{key: "log.file", flag: "log-file", class: NextStart,
			help:  "log file (empty = stderr, or a state-dir file under the dashboard)",
			field: func(c *Config) any { return &c.Log.File }},
		{key: "ui.headless", flag: "headless", class: NextStart,
			help:  "run without the dashboard",
			field: func(c *Config) any { return &c.UI.Headless }},
		{key: "ui.refresh", flag: "refresh", class: Live,
			help:  "dashboard refresh interval (>= 100ms)",
			field: func(c *Config) any { return &c.UI.Refresh },
			check: func(c Config) string {
				if c.UI.Refresh < 100*time.Millisecond {
					return "must be a duration >= 100ms"
				}
				return ""
			}},
		{key: "kv_events.endpoint", flag: "kv-events-endpoint", class: NextStart,
			help:  "ZMQ PUB endpoint of vLLM's KV event stream for routers, tcp://HOST:PORT (empty = off)",
			field: func(c *Config) any { return &c.KVEvents.Endpoint },
			check: func(c Config) string { return zmqEndpoint(c.KVEvents.Endpoint) }},
		{key: "kv_events.connect", flag: "kv-events-connect", class: NextStart,
			help:  "connect the KV event PUB to the endpoint (a router's bound SUB) instead of binding it",
			field: func(c *Config) any { return &c.KVEvents.Connect }},
		{key: "kv_events.replay_endpoint", flag: "kv-events-replay-endpoint", class: NextStart,
			help:  "ZMQ ROUTER endpoint kvdock binds to replay buffered KV event batches (empty = none)",
			field: func(c *Config) any { return &c.KVEvents.ReplayEndpoint },
			check: func(c Config) string {
				if c.KVEvents.ReplayEndpoint != "" && c.KVEvents.Endpoint == "" {
					return "needs kv_events.endpoint"
				}
				if c.KVEvents.ReplayEndpoint != "" && c.KVEvents.ReplayEndpoint == c.KVEvents.Endpoint {
					return "must differ from kv_events.endpoint"
				}
				return zmqEndpoint(c.KVEvents.ReplayEndpoint)
			}},
		{key: "kv_events.replay_format", flag: "kv-events-replay-format", class: NextStart,
			help:    "replay frames: current (vLLM >= 0.26, topic frame) or legacy",
			field:   func(c *Config) any { return &c.KVEvents.ReplayFormat },
			choices: []string{"current", "legacy"}},
		{key: "kv_events.encoding", flag: "kv-events-encoding", class: NextStart,
			help:    "KV event encoding: map (tagged maps: vLLM >= 0.26, llm-d, Dynamo) or array (positional)",
			field:   func(c *Config) any { return &c.KVEvents.Encoding },
			choices: []string{"map", "array"}},
		{key: "kv_events.pod", flag: "kv-events-pod", class: NextStart,
			help:  "pod name in the KV event topic kv@<pod>@<model> (empty = the host name)",
			field: func(c *Config) any { return &c.KVEvents.Pod },
			check: func(c Config) string {
				if strings.ContainsAny(c.KVEvents.Pod, "@\x00") || len(c.KVEvents.Pod) > 253 {
					return "must not contain '@' or NUL, at most 253 bytes"
				}
				return ""
			}},
		{key: "kv_events.buffer_steps", flag: "kv-events-buffer-steps", class: NextStart,
			help:  "KV event batches kept for replay",
			field: func(c *Config) any { return &c.KVEvents.BufferSteps },
			check: func(c Config) string { return intRange(c.KVEvents.BufferSteps, 1, 1000000) }},
		{key: "kv_events.block_size", flag: "kv-events-block-size", class: NextStart,
			help:  "tokens per announced KV event block; 0 = the chunk size, else it must divide it (routers with smaller blocks)",
			field: func(c *Config) any { return &c.KVEvents.BlockSize },
			check: func(c Config) string {
				b := c.KVEvents.BlockSize
				if b < 0 || b > 0 && c.Server.ChunkSize > 0 && c.Server.ChunkSize%b != 0 {
					return fmt.Sprintf("must be 0 or divide server.chunk_size (%d)", c.Server.ChunkSize)
				}
				return ""
			}},
		{key: "kv_events.log_size", flag: "kv-event-log-size", envName: EnvPrefix + "KV_EVENTS_LOG_SIZE", class: NextStart,
			help:  "records kept for LMCache's KV event poll channel (POLL_KV_EVENTS); 0 = off",
			field: func(c *Config) any { return &c.KVEvents.LogSize },
			check: func(c Config) string { return intRange(c.KVEvents.LogSize, 0, 1<<20) }},
		{key: "kv_events.medium_l1", flag: "kv-events-medium-l1", class: NextStart,
			help:  "medium of the L1 pool's KV events",
			field: func(c *Config) any { return &c.KVEvents.MediumL1 },
			check: func(c Config) string {
				if c.KVEvents.MediumL1 == "" || len(c.KVEvents.MediumL1) > 64 {
					return "must be 1..64 bytes"
				}
				return ""
			}},
	}
}

func findDef(key string) (keyDef, bool) {
	for _, d := range table() {
		if d.key == key {
			return d, true
		}
	}
	return keyDef{}, false
}

// zmqEndpoint checks an optional tcp://HOST:PORT endpoint.
func zmqEndpoint(e string) string {
	if e == "" {
		return ""
	}
	rest, ok := strings.CutPrefix(e, "tcp://")
	i := strings.LastIndex(rest, ":")
	if !ok || i <= 0 {
		return "must be tcp://HOST:PORT"
	}
	var port int
	if _, err := fmt.Sscanf(rest[i+1:], "%d", &port); err != nil || fmt.Sprint(port) != rest[i+1:] {
		return "must be tcp://HOST:PORT"
	}
	return intRange(port, 1, 65535)
}

func nonEmpty(s string) string {
	if s == "" {
		return "must not be empty"
	}
	return ""
}

func intRange(v, lo, hi int) string {
	if v < lo || v > hi {
		return fmt.Sprintf("must be in %d..%d", lo, hi)
	}
	return ""
}

func intMin(v, lo int, msg string) string {
	if v < lo {
		return msg
	}
	return ""
}

// ProtocolAuto is the server.protocol value that detects each worker's table.
const ProtocolAuto = "auto"

// ProtocolProfiles lists the explicit protocol profiles, oldest first (the
// names of assets/protocols/*.yaml).
func ProtocolProfiles() []string {
	return []string{"nongpu-v1", "nongpu-v2", "engine-driven", "engine-driven-v2-early", "engine-driven-v2", "rpc-messages"}
}

// ClientProtocol is the profile a client of this server speaks: the
// configured one, or under auto the auto default.
func (s ServerConfig) ClientProtocol() string {
	if s.Protocol == ProtocolAuto {
		return s.ProtocolAutoDefault
	}
	return s.Protocol
}

func oneOf(v string, accepted ...string) string {
	for _, a := range accepted {
		if v == a {
			return ""
		}
	}
	return "accepted: " + strings.Join(accepted, ", ")
}

func fraction(v float64) string {
	if !(v > 0 && v <= 1) {
		return "must be in (0, 1]"
	}
	return ""
}

// maxSizeGB keeps the byte count of the pool inside int64.
const maxSizeGB = 1 << 20

func checkSize(c Config) string {
	v := c.L1.SizeGB
	switch {
	case !(v > 0):
		return "must be > 0"
	case v > maxSizeGB:
		return fmt.Sprintf("must be <= %d", maxSizeGB)
	case c.L1.AlignBytes > 0 && c.L1.SizeBytes() < int64(c.L1.AlignBytes):
		return fmt.Sprintf("a pool of %d bytes is smaller than l1.align_bytes (%d)", c.L1.SizeBytes(), c.L1.AlignBytes)
	}
	return ""
}

// maxShmName bounds server.shm_name; with the segment prefix added it still
// fits NAME_MAX (255).
const maxShmName = 200

func checkShmName(p *string) string {
	if p == nil || *p == "" {
		return ""
	}
	name := strings.TrimPrefix(*p, "/")
	if len(*p) > maxShmName {
		return fmt.Sprintf("must be at most %d characters", maxShmName)
	}
	if name == "" {
		return `must name a segment after the optional leading '/' (use "" to turn SHM off)`
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-'
		if !ok {
			return "may hold only letters, digits, '_', '.' and '-' after an optional leading '/'"
		}
	}
	if name == "." || name == ".." {
		return `must not be "." or ".."`
	}
	return ""
}

// Keys describes every setting, in file order.
func Keys() []KeyInfo {
	def := Default()
	var out []KeyInfo
	for _, d := range table() {
		out = append(out, d.info(&def))
	}
	return out
}

func (d keyDef) info(def *Config) KeyInfo {
	ki := KeyInfo{
		Key: d.key, Flag: d.flag, Env: d.env(), Kind: kindOf(d.field(def)),
		Default: text(d.field(def)), Help: d.help, Class: d.class, Secret: d.secret,
		ReadOnly: d.readOnly, Choices: d.choices,
	}
	if d.negatable {
		ki.NoFlag = "no-" + d.flag
	}
	return ki
}

// LookupKey describes one setting by its dotted key.
func LookupKey(key string) (KeyInfo, bool) {
	d, ok := findDef(key)
	if !ok {
		return KeyInfo{}, false
	}
	def := Default()
	return d.info(&def), true
}

// KeyNames lists every dotted key in file order.
func KeyNames() []string {
	var out []string
	for _, d := range table() {
		out = append(out, d.key)
	}
	return out
}

// Get returns the editable text of a key: what Set accepts to give the same
// value back. An absent server.shm_name reads as AutoText. A read-only key
// (l2.adapters), which Set refuses, reads as Shown: credentials redacted.
func Get(c Config, key string) (string, error) {
	d, ok := findDef(key)
	if !ok {
		return "", fmt.Errorf("unknown setting %q", key)
	}
	if d.readOnly {
		return Shown(c, key)
	}
	return text(d.field(&c)), nil
}

// Shown is the text of a key for display: Get's text, or Redacted for a
// secret that is set (an empty secret shows as empty: nothing to hide).
func Shown(c Config, key string) (string, error) {
	d, ok := findDef(key)
	if !ok {
		return "", fmt.Errorf("unknown setting %q", key)
	}
	if p, ok := d.field(&c).(*[]Adapter); ok {
		return adaptersText(redactAdapters(*p)), nil
	}
	v := text(d.field(&c))
	if d.secret && v != "" {
		return Redacted, nil
	}
	return v, nil
}

// Redact returns c with every secret that is set replaced by Redacted, for
// printing a whole config (Render of it must not be read back).
func Redact(c Config) Config {
	for _, d := range table() {
		if p, ok := d.field(&c).(*string); ok && d.secret && *p != "" {
			*p = Redacted
		}
		if p, ok := d.field(&c).(*[]Adapter); ok {
			*p = redactAdapters(*p)
		}
	}
	return c
}

// Set parses value into key. It checks the type only; run Validate for the
// rules. For server.shm_name, "" turns SHM off and AutoText makes it absent.
func Set(c *Config, key, value string) error {
	d, ok := findDef(key)
	if !ok {
		return fmt.Errorf("unknown setting %q", key)
	}
	if d.readOnly {
		return fmt.Errorf("%s is set only by --%s, %s or the settings file (a restart applies it)", key, d.flag, d.env())
	}
	ptr := d.field(c)
	var v any = value
	if pp, isOpt := ptr.(**string); isOpt && value == AutoText {
		*pp = nil
		return nil
	}
	if reason := assign(ptr, v); reason != "" {
		if d.secret {
			return fmt.Errorf("%s = %s: %s", key, Redacted, reason)
		}
		return fmt.Errorf("%s = %q: %s", key, value, reason)
	}
	d.canon(c)
	return nil
}

// Reset puts a key back to its default.
func Reset(c *Config, key string) error {
	d, ok := findDef(key)
	if !ok {
		return fmt.Errorf("unknown setting %q", key)
	}
	def := Default()
	return Set(c, key, text(d.field(&def)))
}
