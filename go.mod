module github.com/better-compute/bcd

go 1.26.8

require (
	connectrpc.com/connect v1.21.1
	github.com/BurntSushi/toml v1.6.0
	github.com/go-jose/go-jose/v4 v4.1.9
	go.etcd.io/bbolt v1.5.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/insomniacslk/dhcp v0.0.0-20260901064844-234b97448fae // indirect
	golang.org/x/sys v0.50.0 // indirect
	pack.ag/tftp v1.0.1-0.20181129014014-07909dfbde3c // indirect
)

tool (
	connectrpc.com/connect/cmd/protoc-gen-connect-go
	google.golang.org/protobuf/cmd/protoc-gen-go
)
