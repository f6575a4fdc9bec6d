// Command otelcol is a minimal OpenTelemetry Collector for bcd's tests: the
// OTLP receiver and the debug exporter, built from the collector's own
// modules. It has its own go.mod, so no role binary links it; the
// telemetry end-to-end test (e2e/telemetry_test.go) builds it once into
// bin/otelcol and starts it on loopback (docs/telemetry.md).
package main

import (
	"log"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var f otelcol.Factories
	f.Receivers = map[component.Type]receiver.Factory{}
	for _, r := range []receiver.Factory{otlpreceiver.NewFactory()} {
		f.Receivers[r.Type()] = r
	}
	f.Exporters = map[component.Type]exporter.Factory{}
	for _, e := range []exporter.Factory{debugexporter.NewFactory()} {
		f.Exporters[e.Type()] = e
	}
	f.Telemetry = otelconftelemetry.NewFactory()
	return f, nil
}

func main() {
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "otelcol", Description: "bcd's test collector", Version: "test"},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{ResolverSettings: confmap.ResolverSettings{
			ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
			DefaultScheme:     "file",
		}},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatal(err)
	}
}
