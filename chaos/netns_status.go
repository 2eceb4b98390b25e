//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// The netns tier's view of its nodes: addresses, paths, and the cluster
// view each node's HTTP status gives (WaitFormed).

// clusterView is the part of GET /v1/cluster the harness reads.
type clusterView struct {
	NodeID  string `json:"node_id"`
	Leader  string `json:"leader"`
	State   string `json:"state"`
	Members []struct {
		ID     string `json:"id"`
		Voter  bool   `json:"voter"`
		Health string `json:"health"`
	} `json:"members"`
}

var netnsHTTP = &http.Client{Timeout: 3 * time.Second}

// status is node i's own view of the cluster (GET /v1/cluster?stale=true).
func (c *NetnsCluster) status(ctx context.Context, i int) (*clusterView, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+c.HTTPAddr(i)+"/v1/cluster?stale=true", nil)
	if err != nil {
		return nil, err
	}
	resp, err := netnsHTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: GET /v1/cluster: %d %s", c.NodeID(i), resp.StatusCode, b)
	}
	var v clusterView
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%s: GET /v1/cluster: %v", c.NodeID(i), err)
	}
	return &v, nil
}

// WaitFormed waits until every node answers /readyz with 200 and sees the
// same leader and all Size() nodes as voters, bounded by ctx (and by 90 s
// if ctx has no deadline). The error says what was missing last.
func (c *NetnsCluster) WaitFormed(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
	}
	var why string
	for {
		why = c.formed(ctx)
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: cluster not formed: %s (%w)", why, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		for _, n := range c.nodes {
			if err := n.exited(); err != nil {
				return fmt.Errorf("chaos: %s exited while the cluster formed: %v (log %s)", n.id, err, n.log)
			}
		}
	}
}

func (c *NetnsCluster) formed(ctx context.Context) string {
	leader := ""
	for i := range c.nodes {
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+c.HTTPAddr(i)+"/readyz", nil)
		if err != nil {
			return err.Error()
		}
		resp, err := netnsHTTP.Do(req)
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Sprintf("%s /readyz %d", c.NodeID(i), resp.StatusCode)
		}
		v, err := c.status(ctx, i)
		if err != nil {
			return err.Error()
		}
		if v.Leader == "" || leader != "" && v.Leader != leader {
			return fmt.Sprintf("%s sees leader %q", c.NodeID(i), v.Leader)
		}
		leader = v.Leader
		voters := 0
		for _, m := range v.Members {
			if m.Voter {
				voters++
			}
		}
		if voters != len(c.nodes) {
			return fmt.Sprintf("%s sees %d voters of %d", c.NodeID(i), voters, len(c.nodes))
		}
	}
	return ""
}

func (c *NetnsCluster) Size() int { return c.opts.Nodes }

// NodeID is node i's --node-id: n<i>, or the id Reidentify gave it.
func (c *NetnsCluster) NodeID(i int) string {
	if i >= 0 && i < len(c.nodes) {
		n := c.nodes[i]
		n.mu.Lock()
		id := n.renamed
		n.mu.Unlock()
		if id != "" {
			return id
		}
	}
	return fmt.Sprintf("n%d", i)
}

func (c *NetnsCluster) HTTPAddr(i int) string { return c.nodeIP(i) + ":" + strconv.Itoa(netnsHTTPPort) }
func (c *NetnsCluster) LogPath(i int) string  { return c.nodes[i].log }
func (c *NetnsCluster) DataDir(i int) string  { return c.nodes[i].data }
