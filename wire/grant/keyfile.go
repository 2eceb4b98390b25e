package grant

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// A signing key file holds one Ed25519 private key as a PKCS #8 PEM block
// ("PRIVATE KEY"), as 'openssl genpkey -algorithm ed25519' writes it and
// 'leasehold keygen --grant' prints it. Errors about a key file name the
// file and the problem, never the key.

// GenerateKey returns a new random Ed25519 private key.
func GenerateKey() ed25519.PrivateKey {
	_, priv, _ := ed25519.GenerateKey(rand.Reader) // crypto/rand never fails (Go 1.24+)
	return priv
}

// MarshalPrivateKey encodes priv as a PKCS #8 PEM block.
func MarshalPrivateKey(priv ed25519.PrivateKey) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		panic("grant: PKCS #8 of an Ed25519 key: " + err.Error()) // cannot fail for a valid key
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// ParsePrivateKey decodes a PKCS #8 PEM block holding an Ed25519 private
// key; anything else in the input (another block, text) is refused.
func ParsePrivateKey(b []byte) (ed25519.PrivateKey, error) {
	block, rest := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM block (want an Ed25519 private key in PKCS #8 PEM, as 'leasehold keygen --grant' prints)")
	}
	if block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("PEM block %q, want \"PRIVATE KEY\" (PKCS #8)", block.Type)
	}
	if len(pemTrim(rest)) > 0 {
		return nil, errors.New("data after the PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, errors.New("not a PKCS #8 private key")
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, want an Ed25519 key", k)
	}
	return priv, nil
}

func pemTrim(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\n' || b[0] == '\r' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// LoadKeyFile reads the private key in path.
func LoadKeyFile(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	priv, err := ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return priv, nil
}

// LoadOrCreateKeyFile reads the private key in path, or, when there is no
// such file, makes a new key and writes it there (mode 0600, written to a
// temporary file, synced and renamed, so that a crash leaves either no file
// or a whole one). created reports which.
func LoadOrCreateKeyFile(path string) (priv ed25519.PrivateKey, created bool, err error) {
	priv, err = LoadKeyFile(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return priv, false, err
	}
	priv = GenerateKey()
	if err := writeFileAtomic(path, MarshalPrivateKey(priv)); err != nil {
		return nil, false, err
	}
	return priv, true, nil
}

func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename: nothing to remove
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
