// Pinned release of the Gateway API, whose standard-install CRDs (config/crd/standard) the
// cluster tests of the router's HTTPRoute install. Fetched by ../fetch-gateway-api.sh into
// $DISAGG_CACHE/gateway-api-<version>/crds; never committed. Nothing here is built, so
// `go mod tidy` would drop the requirement: edit the version here and in go.sum by hand
// (`go mod download -json sigs.k8s.io/gateway-api@<version>` prints both sums).
module disagg.local/gatewayapi

go 1.26.0

require sigs.k8s.io/gateway-api v1.6.3
