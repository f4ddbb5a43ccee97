// Pinned sources of Perses, the dashboard server and UI that renders the chart's Grafana
// dashboard for the screenshot in docs (Grafana itself is AGPL and not served here). Built by
// ../../metrics/build-perses.sh (UI from ui/ with npm, server with go build) into
// $DISAGG_CACHE/perses-<version>; never committed.
module disagg.local/metricsbin/perses

go 1.26.0

require github.com/perses/perses v0.52.0
