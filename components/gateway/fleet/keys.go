package fleet

import "crypto"

// WorkloadKey is the public key workload tokens verify under.
func (s *Fleet) WorkloadKey() crypto.PublicKey { return s.keys.Workload.Public() }
