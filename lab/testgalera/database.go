package testgalera

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// CreateDatabase creates the database name through node via (any node:
// Galera replicates the DDL to the others before it returns).
func (c *Cluster) CreateDatabase(ctx context.Context, via int, name string) error {
	db, err := sql.Open("mysql", "root@tcp("+c.Nodes[via].Addr+")/?timeout=5s")
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+strings.ReplaceAll(name, "`", "``")+"`"); err != nil {
		return fmt.Errorf("testgalera: create database %s: %w", name, err)
	}
	return nil
}

// URLFrom is the service's DATABASE_URL of the database db, naming every
// node with node first: the connector takes the first that serves, so an
// instance given URLFrom(i, db) writes through node i while it is up.
func (c *Cluster) URLFrom(first int, db string) string {
	addrs := c.Addrs()
	ordered := append(append([]string{}, addrs[first%len(addrs):]...), addrs[:first%len(addrs)]...)
	return "mysql://root@" + strings.Join(ordered, ",") + "/" + db
}
