package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// OpenTraced is Open with tracer told of every statement.
func OpenTraced(ctx context.Context, url string, tracer pgx.QueryTracer) (*PG, error) {
	return open(ctx, url, tracer)
}
