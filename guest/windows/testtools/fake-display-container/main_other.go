//go:build !windows

// Command fake-display-container is Windows test scaffolding; elsewhere it only builds.
package main

func main() {}
