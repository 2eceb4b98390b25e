//go:build linux

package chaos

import (
	"context"
	"fmt"
	"time"
)

// RecoverAlone kills node i and runs `leasehold data recover` on its data
// directory: its configuration becomes itself alone, a voter. It returns
// the command's output. The canary_config_recover harness fault (see
// canaryRecoverAlone); never a product path while a quorum lives.
func (c *NetnsCluster) RecoverAlone(i int) (string, error) {
	n, err := c.node(i)
	if err != nil {
		return "", err
	}
	if err := n.kill(); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := output(ctx, nil, c.opts.Binary, "data", "recover", "--data-dir", n.data)
	c.log.Info("data recover (a harness fault)", "node", n.id, "out", out, "err", err)
	if err != nil {
		return out, fmt.Errorf("chaos: data recover of %s: %w", n.id, err)
	}
	return out, nil
}
