package update

// SetCrash sets the function called at each step's named point of
// Install, Confirm and the swap back (fakehw end-to-end tests kill the
// process there; see TestKillAtEachStep).
func (s *Slots) SetCrash(f func(point string)) { s.crash = f }
