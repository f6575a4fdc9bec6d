package fleet

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
)

func RandomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// NewToken makes and stores a join token and returns its string, which is
// shown once and stored only as a hash.
func (s *Fleet) NewToken(role, site string, uses int, ttl time.Duration) (string, store.Token, error) {
	if role != "node" && role != "site" {
		return "", store.Token{}, fmt.Errorf("role must be node or site")
	}
	if uses < 1 {
		return "", store.Token{}, fmt.Errorf("uses must be at least 1")
	}
	if site == "" {
		site = "lab"
	}
	t := store.Token{Role: role, Site: site, Uses: uses}
	if ttl > 0 {
		t.ExpiresAt = s.now().Add(ttl).UTC()
	}
	tok, t, err := s.mintToken(t)
	if err != nil {
		return "", t, err
	}
	s.log.Info("join token created", "token_id", t.ID, "role", role, "site", site, "uses", uses)
	return tok, t, nil
}

// NewCloudRule stores a cloud-iid rule: a token no one holds, which admits
// up to uses EC2 instances of account (and region, when set) that prove
// themselves with their signed identity document (agentsvc).
func (s *Fleet) NewCloudRule(role, site, account, region string, uses int, ttl time.Duration) (store.Token, error) {
	if role == "" {
		role = "node"
	}
	if role != "node" && role != "site" {
		return store.Token{}, fmt.Errorf("role must be node or site")
	}
	if uses < 1 {
		return store.Token{}, fmt.Errorf("uses must be at least 1")
	}
	if !awsAccount.MatchString(account) {
		return store.Token{}, fmt.Errorf("cloud_iid_account must be an AWS account id of 12 digits")
	}
	if region != "" && !awsRegion.MatchString(region) {
		return store.Token{}, fmt.Errorf("cloud_iid_region must be an AWS region such as us-east-1")
	}
	if site == "" {
		site = "lab"
	}
	t := store.Token{Role: role, Site: site, Uses: uses, CloudAccount: account, CloudRegion: region}
	if ttl > 0 {
		t.ExpiresAt = s.now().Add(ttl).UTC()
	}
	t.ID, t.CreatedAt = "jt"+RandomID(8), s.now().UTC()
	t.Hash = store.HashSecret(s.RuleSecret(t.ID))
	if err := s.store.PutToken(t); err != nil {
		return t, err
	}
	s.log.Info("cloud-iid rule created", "token_id", t.ID, "role", role, "site", site, "account", account, "region", region, "uses", uses)
	return t, nil
}

var (
	awsAccount = regexp.MustCompile(`^[0-9]{12}$`)
	awsRegion  = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]$`)
)

// RuleSecret is a cloud-iid rule's secret: derived from the join-signing
// key, which every gateway of a fleet holds, so any of them can spend the
// rule, and never shown to anyone.
func (s *Fleet) RuleSecret(id string) string {
	der, err := x509.MarshalPKCS8PrivateKey(s.keys.JoinSigning)
	if err != nil {
		// No key to derive from: a secret no one can compute.
		return RandomID(20)
	}
	k := sha256.Sum256(append([]byte("bcd-cloud-iid-rule\x00"), der...))
	m := hmac.New(sha256.New, k[:])
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil))
}

// mintToken gives t a new id and secret, stores it with the secret's hash
// only, and returns the token string bcjt_<id>_<secret>.
func (s *Fleet) mintToken(t store.Token) (string, store.Token, error) {
	secret := RandomID(20)
	t.ID, t.Hash, t.CreatedAt = "jt"+RandomID(8), store.HashSecret(secret), s.now().UTC()
	if err := s.store.PutToken(t); err != nil {
		return "", t, err
	}
	return "bcjt_" + t.ID + "_" + secret, t, nil
}
