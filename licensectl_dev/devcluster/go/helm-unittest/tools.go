//go:build tools

// Package tools pins the helm-unittest plugin binary this module builds.
package tools

import _ "github.com/helm-unittest/helm-unittest/cmd/helm-unittest"
