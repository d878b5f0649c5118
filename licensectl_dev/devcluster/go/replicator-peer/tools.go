//go:build tools

// Package tools names the command this module builds (cmd/replicator-peer), as the other wrapper
// modules do; the command itself pins its dependencies through go.mod.
package tools

import _ "licensectl.dev/gotools/replicator-peer/cmd/replicator-peer"
