package zero

import (
	"encoding/json"
	"fmt"
	"os"

	"libzero/internal/capi"
)

// ConfigFromMap turns a DeepSpeed config given as Go values (maps, slices, strings, numbers, bools) into its JSON.
func ConfigFromMap(config map[string]any) (string, error) {
	text, err := json.Marshal(config)
	if err != nil {
		return "", fmt.Errorf("libzero: the config cannot be written as JSON: %w", err)
	}
	return string(text), nil
}

// ConfigFromFile reads a ds_config.json.
func ConfigFromFile(path string) (string, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("libzero: reading the config: %w", err)
	}
	return string(text), nil
}

// CheckConfig reports what libzero will do with config for worldSize ranks (the text `zero-config check` prints).
func CheckConfig(config string, worldSize int) (string, error) {
	if err := cString(config, "the config"); err != nil {
		return "", err
	}
	if _, err := id32(worldSize, "world size"); err != nil {
		return "", err
	}
	var report string
	err := call(func() error { return capi.Zero_config_check(&report, config, worldSize) })
	return report, err
}
