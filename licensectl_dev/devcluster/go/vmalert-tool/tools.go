//go:build tools

// Package tools pins the vmalert-tool command this module builds (alert rule unit tests on MetricsQL).
package tools

import _ "github.com/VictoriaMetrics/VictoriaMetrics/app/vmalert-tool"
