// Package schema holds the database schema of the service as plain SQL
// migrations, one folder per engine, so each engine's SQL stays readable on
// its own. They are embedded in the binary and applied by goose at start-up
// or by `stock migrate`; goose keeps its own version table.
//
// The package lives in the folder sql/ so the schema is visible from the top
// of the repository; it is named schema so that importers do not shadow
// database/sql.
package schema

import (
	"embed"
	"io/fs"
)

//go:embed postgres/*.sql mysql/*.sql
var files embed.FS

// PostgresFS returns the PostgreSQL migrations (the folder postgres/).
func PostgresFS() fs.FS { return sub("postgres") }

// MySQLFS returns the MySQL/MariaDB migrations (the folder mysql/).
func MySQLFS() fs.FS { return sub("mysql") }

func sub(dir string) fs.FS {
	f, err := fs.Sub(files, dir)
	if err != nil {
		// fs.Sub fails only on an invalid path, and dir is a constant.
		panic(err)
	}
	return f
}
