module github.com/jetfleet/jetfleet/tools

go 1.26.8

// go-task is pinned at v3.39.2, the last release before remote Taskfiles
// brought go-git (v3.40) and then go-getter with the AWS and Google Cloud SDKs
// (v3.46): a first `go tool task` builds 26 modules instead of 124 (v3.53.1).
// It runs every task of Taskfile.yml. Older releases save little (v3.37.0: 22
// modules, v3.30 to v3.36: 20), and v3.35 and v3.36 take any data on stdin for
// a Taskfile.
tool (
	github.com/go-task/task/v3/cmd/task
	google.golang.org/protobuf/cmd/protoc-gen-go
)

require (
	github.com/Ladicle/tabwriter v1.0.0 // indirect
	github.com/Masterminds/semver/v3 v3.3.0 // indirect
	github.com/alecthomas/chroma/v2 v2.14.0 // indirect
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/dlclark/regexp2 v1.11.0 // indirect
	github.com/dominikbraun/graph v0.23.0 // indirect
	github.com/fatih/color v1.17.0 // indirect
	github.com/go-task/slim-sprig/v3 v3.0.0 // indirect
	github.com/go-task/task/v3 v3.39.2 // indirect
	github.com/go-task/template v0.1.0 // indirect
	github.com/joho/godotenv v1.5.1 // indirect
	github.com/klauspost/cpuid/v2 v2.0.9 // indirect
	github.com/mattn/go-colorable v0.1.13 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/mattn/go-zglob v0.0.6 // indirect
	github.com/mitchellh/hashstructure/v2 v2.0.2 // indirect
	github.com/muesli/cancelreader v0.2.2 // indirect
	github.com/radovskyb/watcher v1.0.7 // indirect
	github.com/sajari/fuzzy v1.0.0 // indirect
	github.com/spf13/pflag v1.0.5 // indirect
	github.com/zeebo/xxh3 v1.0.2 // indirect
	golang.org/x/sync v0.8.0 // indirect
	golang.org/x/sys v0.25.0 // indirect
	golang.org/x/term v0.24.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
	mvdan.cc/sh/v3 v3.9.0 // indirect
)
