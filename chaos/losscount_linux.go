package chaos

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
)

// lossCounted matches the packet counter of a loss rule in `nft list`'s
// output (nft.go's render gives the rule its comment).
var lossCounted = regexp.MustCompile(`counter packets (\d+) bytes \d+ drop comment "loss"`)

// LossHits is how many packets the loss rules now in force dropped, over
// every node (a table's counters start again when its rules change, so
// read it before healing).
func (c *NetnsCluster) LossHits() (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), faultTimeout)
	defer cancel()
	var total int64
	for i := range c.opts.Nodes {
		out, err := output(ctx, nil, "ip", "netns", "exec", c.Namespace(i), "nft", "list", "table", "inet", c.tableName())
		if err != nil {
			return total, fmt.Errorf("chaos: %s: %w", c.NodeID(i), err)
		}
		for _, m := range lossCounted.FindAllStringSubmatch(out, -1) {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			total += n
		}
	}
	return total, nil
}
