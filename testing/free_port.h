// FreeLoopbackPort: a TCP port on 127.0.0.1 that was free a moment ago, for tests that start a
// rendezvous store on a fixed port (RendezvousOptions::master_port). The kernel picks it (bind to
// port 0) and the socket is closed again, so another process may take it before the test does; a
// test that must not race uses port 0 and reads the store's port instead. Test-only.
#pragma once

namespace zero::testing {

// The port, or -1 when no socket could be bound (the caller fails).
int FreeLoopbackPort();

}  // namespace zero::testing
