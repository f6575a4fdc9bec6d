package sshspec

import "strings"

// keywords are sshd_config's keywords in lower case (OpenSSH 9, as
// `sshd -T` lists them, plus Match, Include and the deprecated names
// sshd still reads). A field equal to one, in any case, is refused: it
// could only be there to become a configuration line.
var keywords = map[string]bool{}

func init() {
	for _, k := range strings.Fields(keywordList) {
		keywords[k] = true
	}
}

// IsKeyword reports whether s is an sshd_config keyword, in any case.
func IsKeyword(s string) bool { return keywords[strings.ToLower(s)] }

const keywordList = `match include acceptenv challengeresponseauthentication dsaauthentication
pubkeyacceptedkeytypes hostbasedacceptedkeytypes rsaauthentication rhostsrsaauthentication
skeyauthentication useprivilegeseparation protocol serverkeybits keyregenerationinterval
subsystem setenv rdomain channeltimeout allowusers denyusers allowgroups denygroups
addressfamily allowagentforwarding allowstreamlocalforwarding allowtcpforwarding
authenticationmethods authorizedkeyscommand authorizedkeyscommanduser authorizedkeysfile
authorizedprincipalscommand authorizedprincipalscommanduser authorizedprincipalsfile banner
casignaturealgorithms chrootdirectory ciphers clientalivecountmax clientaliveinterval
compression disableforwarding exposeauthinfo fingerprinthash forcecommand gatewayports
gssapiauthentication gssapicleanupcredentials gssapikexalgorithms gssapikeyexchange
gssapistorecredentialsonrekey gssapistrictacceptorcheck hostbasedacceptedalgorithms
hostbasedauthentication hostbasedusesnamefrompacketonly hostkey hostkeyagent hostkeyalgorithms
ignorerhosts ignoreuserknownhosts ipqos kbdinteractiveauthentication kerberosauthentication
kerberosorlocalpasswd kerberosticketcleanup kexalgorithms listenaddress logingracetime
loglevel macs maxauthtries maxsessions maxstartups modulifile passwordauthentication
permitemptypasswords permitlisten permitopen permitrootlogin permittty permittunnel
permituserenvironment permituserrc persourcemaxstartups persourcenetblocksize pidfile port
printlastlog printmotd pubkeyacceptedalgorithms pubkeyauthentication pubkeyauthoptions rekeylimit
requiredrsasize revokedkeys securitykeyprovider streamlocalbindmask streamlocalbindunlink
strictmodes syslogfacility tcpkeepalive trustedusercakeys unusedconnectiontimeout usedns usepam
versionaddendum x11displayoffset x11forwarding x11uselocalhost xauthlocation
`
