package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"

	"github.com/leasehold/leasehold/node"
)

// The sealing key file (--seal-key-file, LEASEHOLD_SEAL_KEY_FILE): one line,
// the standard base64 of 32 random bytes (what 'leasehold keygen' prints);
// surrounding white space is ignored. Every server of a cluster reads the
// same key. See docs/security.md.

// sealKeyGen is how the error messages say to make a key.
const sealKeyGen = "leasehold keygen > seal.key"

// loadSealKey reads the sealing key file. Errors never include the key.
func loadSealKey(path string, log *slog.Logger) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--seal-key-file: %w", err)
	}
	k, err := decodeKey(string(b), sealKeyGen, node.SealKeyBytes)
	if err != nil {
		return nil, fmt.Errorf("--seal-key-file %s: %w", path, err)
	}
	warnIfReadable(log, "--seal-key-file", path)
	return k, nil
}

// setupSealKey returns the sealing key of --seal-key-file, or nil (the node
// derives one from the gossip key when there is one), and says at start which
// it is; without either it warns that backups let guesses be tested.
func setupSealKey(file string, gossipKey []byte, log *slog.Logger) ([]byte, error) {
	switch {
	case file != "":
		return loadSealKey(file, log)
	case len(gossipKey) > 0:
		log.Info("no --seal-key-file: the sealing key is derived from the gossip key (changing the gossip key is a sealing key rotation)")
	default:
		log.Warn("no --seal-key-file and no gossip key: idempotency keys are stored as unkeyed SHA-256 in the Raft log, snapshots and backups; " +
			"whoever holds a copy can test guessed idempotency keys offline and recover the tokens of idempotent acquires. " +
			"Make a key with 'leasehold keygen' and pass --seal-key-file (the same file) on every server (docs/security.md)")
	}
	return nil, nil
}

// keygenCmd prints a fresh random sealing key.
func (a *app) keygenCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("keygen", "", "Print a fresh random key: the standard base64 of 32 random bytes, one line.\n"+
		"Use it as the sealing key (--seal-key-file: the same file on every server, kept apart\n"+
		"from the data directory and its backups) or as the gossip key (--gossip-key-file):\n"+
		"  leasehold keygen > seal.key && chmod 0600 seal.key\n"+
		"With --grant: an Ed25519 grant signing key in PKCS #8 PEM, for one server's --grant-key-file:\n"+
		"  (umask 077; leasehold keygen --grant > grant.key)")
	grantKey := fs.Bool("grant", false, "print an Ed25519 grant signing key (PKCS #8 PEM) instead")
	err := a.parseNone(fs, args, nil, "")
	if err != nil {
		return err
	}
	if *grantKey {
		return printGrantKey(a.stdout)
	}
	k := make([]byte, node.SealKeyBytes)
	rand.Read(k) // crypto/rand.Read never fails (Go 1.24+)
	_, err = fmt.Fprintln(a.stdout, base64.StdEncoding.EncodeToString(k))
	return err
}

// sealKeySource names where the sealing key comes from, for the start log.
func sealKeySource(file string, gossipKey []byte) string {
	switch {
	case file != "":
		return "file"
	case len(gossipKey) > 0:
		return "gossip-key"
	}
	return "none"
}
