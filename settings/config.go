// Package settings holds kvdock's configuration: the typed Config with its
// defaults, layered loading (defaults < YAML file < environment < flags) that
// remembers where every value came from, validation that reports every problem
// at once, the diff of two configs with the restart class of each change, and
// saving the dashboard's edits into the settings file in place.
//
// It imports nothing else of kvdock, so every other package can depend on it.
package settings

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// Config is everything kvdock can be told. Field tags name the YAML keys; the
// flag of a key is its name with '_' → '-' and, for groups other than server,
// the group as a prefix (l1.size_gb → --l1-size-gb).
type Config struct {
	Server   ServerConfig   `koanf:"server"`
	L1       L1Config       `koanf:"l1"`
	Eviction EvictionConfig `koanf:"eviction"`
	L2       L2Config       `koanf:"l2"`
	HTTP     HTTPConfig     `koanf:"http"`
	Log      LogConfig      `koanf:"log"`
	UI       UIConfig       `koanf:"ui"`
	KVEvents KVEventsConfig `koanf:"kv_events"`
}

// ServerConfig is the MP server part: the ZMQ endpoint, handler pools and the
// transfer choices.
type ServerConfig struct {
	Host      string `koanf:"host"`
	Port      int    `koanf:"port"`
	ChunkSize int    `koanf:"chunk_size"`
	// MaxWorkers is the base size of both handler pools.
	MaxWorkers int `koanf:"max_workers"`
	// MaxGPUWorkers sizes the per-worker ordered (affinity) pool; 0 means MaxWorkers.
	MaxGPUWorkers int `koanf:"max_gpu_workers"`
	// MaxCPUWorkers sizes the shared pool; 0 means MaxWorkers.
	MaxCPUWorkers int    `koanf:"max_cpu_workers"`
	HashAlgorithm string `koanf:"hash_algorithm"`
	TransferMode  string `koanf:"transfer_mode"`
	// ShmName is tri-state: nil = auto (L1 settings decide), "" = SHM off
	// (pickle for every worker), other = that segment name (normalised).
	ShmName  *string `koanf:"shm_name"`
	Protocol string  `koanf:"protocol"`
	// ProtocolAutoDefault is the fallback profile of Protocol "auto".
	ProtocolAutoDefault string `koanf:"protocol_auto_default"`
	// MaxMessageBytes rejects larger ZMQ messages without allocating them;
	// an upper bound on the cap derived from the registered layouts.
	MaxMessageBytes int64 `koanf:"max_message_bytes"`
	// MaxInstances bounds the worker instances registered at once; new ones
	// beyond it are refused (re-registering a known id is not new).
	MaxInstances int `koanf:"max_instances"`
	// MaxTokensPerRequest caps the token ids of one request's key.
	MaxTokensPerRequest int `koanf:"max_tokens_per_request"`
	// WorkerReapTimeoutSeconds is upstream's silence budget after which a
	// worker that pinged with its id and transferred is reaped (its context
	// dropped, its reservations released); 0 disables reaping. Only profiles
	// whose PING carries the instance id reap.
	WorkerReapTimeoutSeconds float64 `koanf:"worker_reap_timeout_seconds"`
	// WorkerRegistrationGraceSeconds is upstream's silence budget for a
	// worker that has not both pinged and transferred yet.
	WorkerRegistrationGraceSeconds float64 `koanf:"worker_registration_grace_seconds"`
	// WorkerIdleSeconds is the silence after which a context shows as idle
	// (every profile; idle workers are never reaped for it); 0 never.
	WorkerIdleSeconds float64 `koanf:"worker_idle_seconds"`
	// QueuedRequestBytes bounds request payloads queued for the workers
	// (total; a quarter per peer).
	QueuedRequestBytes int64 `koanf:"queued_request_bytes"`
	// QueuedReplyBytesPerPeer bounds replies kept for a peer that does not
	// read them (eight times that in total).
	QueuedReplyBytesPerPeer int64 `koanf:"queued_reply_bytes_per_peer"`
	// MaxInflightPickleMB bounds the large request frames (pickled chunks)
	// held from their receive until their handler is done.
	MaxInflightPickleMB int `koanf:"max_inflight_pickle_mb"`
	// GoMemoryLimitMB is the Go heap's soft limit; 0 derives it
	// (GoMemoryLimit).
	GoMemoryLimitMB int `koanf:"go_memory_limit_mb"`
	// StateDir holds what must outlive the process (the kept pool's table
	// and registrations for a restart); "" = $XDG_STATE_HOME/kvdock, else
	// ~/.local/state/kvdock (StateDirPath).
	StateDir string `koanf:"state_dir"`
}

// GoMemoryLimit is the Go heap's soft limit in bytes: GoMemoryLimitMB, or
// when 0, 64 MiB for the server's own state plus twice the in-flight pickle
// bytes (a pickle reply is built in Go and copied out once; its garbage
// lives until the next collection). The pool is mapped outside the Go heap.
func (s ServerConfig) GoMemoryLimit() int64 {
	if s.GoMemoryLimitMB > 0 {
		return int64(s.GoMemoryLimitMB) << 20
	}
	return 64<<20 + 2*int64(s.MaxInflightPickleMB)<<20
}

// L1Config is the L1 memory pool.
type L1Config struct {
	SizeGB          float64 `koanf:"size_gb"`
	UseLazy         bool    `koanf:"use_lazy"`
	AlignBytes      int     `koanf:"align_bytes"`
	WriteTTLSeconds int     `koanf:"write_ttl_seconds"`
	ReadTTLSeconds  int     `koanf:"read_ttl_seconds"`
	Prefault        bool    `koanf:"prefault"`
	// AllowOvercommit lets the pool be larger than the host's available
	// memory (see CheckMemory).
	AllowOvercommit bool `koanf:"allow_overcommit"`
	// MaxLockedSharePerInstance and MaxLockedShare cap the share of the pool
	// one worker instance (or all lookups) and everyone together may hold
	// locked (reserved for writing or read-locked) at once.
	MaxLockedSharePerInstance float64 `koanf:"max_locked_share_per_instance"`
	MaxLockedShare            float64 `koanf:"max_locked_share"`
	// KeepOnExit keeps the pool's segment and records its state at a
	// graceful stop (SIGTERM, SIGINT), so that the next start adopts it.
	KeepOnExit bool `koanf:"keep_on_exit"`
}

// EvictionConfig is the L1 eviction policy and its watermark loop.
type EvictionConfig struct {
	Policy           string  `koanf:"policy"`
	TriggerWatermark float64 `koanf:"trigger_watermark"`
	Ratio            float64 `koanf:"ratio"`
}

// HTTPConfig is the operator HTTP API; Port 0 disables it.
type HTTPConfig struct {
	Host  string `koanf:"host"`
	Port  int    `koanf:"port"`
	Token string `koanf:"token"`
}

// LogConfig selects the slog handler; File "" means stderr in headless mode
// and a file under the state directory while the dashboard owns the screen.
type LogConfig struct {
	Level  string `koanf:"level"`
	Format string `koanf:"format"`
	File   string `koanf:"file"`
}

// UIConfig is the operator face.
type UIConfig struct {
	Headless bool          `koanf:"headless"`
	Refresh  time.Duration `koanf:"refresh"`
}

// KVEventsConfig is vLLM's KV event stream for cache-aware routers
// (docs/EVENTS.md): off while Endpoint is empty.
type KVEventsConfig struct {
	// Endpoint is the ZMQ PUB endpoint (tcp://HOST:PORT); empty = off.
	Endpoint string `koanf:"endpoint"`
	// Connect connects the PUB to Endpoint (a router's bound SUB) instead
	// of binding it.
	Connect bool `koanf:"connect"`
	// ReplayEndpoint is the replay ROUTER's endpoint; empty = no replay.
	ReplayEndpoint string `koanf:"replay_endpoint"`
	// ReplayFormat is "current" (vLLM >= 0.26: topic frame, empty-topic end
	// marker) or "legacy".
	ReplayFormat string `koanf:"replay_format"`
	// Encoding of events: "map" (tagged maps) or "array" (positional).
	Encoding string `koanf:"encoding"`
	// Pod names the topic kv@<pod>@<model>; empty = the host name.
	Pod string `koanf:"pod"`
	// BufferSteps is how many batches the replay buffer keeps.
	BufferSteps int `koanf:"buffer_steps"`
	// MediumL1 is the medium of the L1 pool's announcements.
	MediumL1 string `koanf:"medium_l1"`
	// BlockSize announces each chunk as chunk_size/BlockSize blocks (0 =
	// the chunk size); it must divide server.chunk_size.
	BlockSize int `koanf:"block_size"`
	// LogSize is how many records the poll log of LMCache's KV event
	// channel (POLL_KV_EVENTS) keeps; 0 = the channel is off. It runs
	// whether or not Endpoint is set.
	LogSize int `koanf:"log_size"`
}

// Default returns the configuration kvdock runs with when told nothing.
func Default() Config {
	return Config{
		Server: ServerConfig{
			Host:                    "localhost",
			Port:                    5555,
			ChunkSize:               256,
			MaxWorkers:              1,
			HashAlgorithm:           "blake3",
			TransferMode:            "non_gpu",
			Protocol:                "nongpu-v1",
			ProtocolAutoDefault:     "rpc-messages",
			MaxMessageBytes:         1 << 30,
			MaxInstances:            1024,
			MaxTokensPerRequest:     2 << 20,
			QueuedRequestBytes:      256 << 20,
			QueuedReplyBytesPerPeer: 128 << 20,
			MaxInflightPickleMB:     256,

			WorkerReapTimeoutSeconds:       120,
			WorkerRegistrationGraceSeconds: 3600,
			WorkerIdleSeconds:              300,
		},
		L1: L1Config{
			SizeGB:          1,
			AlignBytes:      4096,
			WriteTTLSeconds: 600,
			ReadTTLSeconds:  300,
			Prefault:        true,

			MaxLockedSharePerInstance: 0.5,
			MaxLockedShare:            0.9,
		},
		Eviction: EvictionConfig{Policy: "prefix", TriggerWatermark: 0.8, Ratio: 0.2},
		L2: L2Config{
			StorePolicy:         "write-behind",
			PrefetchMaxInFlight: 8,
			LoadTimeoutSeconds:  2,
			QueueBytes:          256 << 20,
		},
		HTTP:     HTTPConfig{Host: "127.0.0.1", Port: 8080},
		Log:      LogConfig{Level: "info", Format: "text"},
		UI:       UIConfig{Refresh: time.Second},
		KVEvents: KVEventsConfig{ReplayFormat: "current", Encoding: "map", BufferSteps: 10000, MediumL1: "CPU", LogSize: 32768},
	}
}

// GPUWorkers is the effective size of the per-worker ordered pool.
func (s ServerConfig) GPUWorkers() int {
	if s.MaxGPUWorkers > 0 {
		return s.MaxGPUWorkers
	}
	return s.MaxWorkers
}

// CPUWorkers is the effective size of the shared handler pool.
func (s ServerConfig) CPUWorkers() int {
	if s.MaxCPUWorkers > 0 {
		return s.MaxCPUWorkers
	}
	return s.MaxWorkers
}

// StateDirPath is the state directory: StateDir when set, else
// $XDG_STATE_HOME/kvdock, else ~/.local/state/kvdock (getenv reads the
// environment, home the user's home directory).
func (s ServerConfig) StateDirPath(getenv func(string) string, home func() (string, error)) (string, error) {
	if s.StateDir != "" {
		return s.StateDir, nil
	}
	if d := getenv("XDG_STATE_HOME"); d != "" && strings.HasPrefix(d, "/") {
		return filepath.Join(d, "kvdock"), nil
	}
	h, err := home()
	if err != nil || h == "" {
		return "", fmt.Errorf("no state directory: server.state_dir unset, XDG_STATE_HOME unset and no home directory (%v)", err)
	}
	return filepath.Join(h, ".local", "state", "kvdock"), nil
}

// SizeBytes is the L1 pool size in bytes (GiB × 2^30, as upstream).
func (l L1Config) SizeBytes() int64 {
	return int64(l.SizeGB * (1 << 30))
}
