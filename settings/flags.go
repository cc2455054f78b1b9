package settings

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// ConfigFlag is the flag naming the settings file.
const ConfigFlag = "config"

// RegisterFlags adds one flag per setting (LMCache's names, Default() as the
// default, help naming the env var), --no-l1-use-lazy and --no-l1-prefault,
// and --config. Load reads only the flags actually given.
func RegisterFlags(fs *pflag.FlagSet) {
	def := Default()
	for _, d := range table() {
		usage := fmt.Sprintf("%s [%s]", d.help, d.env())
		switch p := d.field(&def).(type) {
		case *string:
			fs.String(d.flag, *p, usage)
		case **string:
			fs.String(d.flag, "", usage)
		case *int:
			fs.Int(d.flag, *p, usage)
		case *int64:
			fs.Int64(d.flag, *p, usage)
		case *float64:
			fs.Float64(d.flag, *p, usage)
		case *bool:
			fs.Bool(d.flag, *p, usage)
			if d.negatable {
				fs.Bool("no-"+d.flag, false, fmt.Sprintf("turn off --%s", d.flag))
			}
		case *time.Duration:
			fs.Duration(d.flag, *p, usage)
		case *[]Adapter:
			// Repeated, the flags replace the file's or env's list whole.
			fs.StringArray(d.flag, nil, usage)
		}
	}
	fs.String(ConfigFlag, "", fmt.Sprintf(`settings file (default $XDG_CONFIG_HOME/kvdock/config.yaml when it exists; "" = none) [%s]`, EnvConfig))
}
