// Package zklock is STRATEGY=zk-lock's lock: a ZooKeeper lock in the style
// of Curator's InterProcessMutex, with a context on every wait, a loss
// signal, fencing tokens and a local FIFO hand-over between the goroutines
// of one process.
//
// # The recipe
//
// The lock named n is the folder <prefix>/n. A contender creates an
// ephemeral sequential node in it whose name starts with a random GUID
// ("_c_<guid>-lock-0000000042", ZooKeeper's "protected" name): if the
// create's answer is lost with the connection, the contender lists the
// folder and finds its node again by the GUID, instead of leaving an
// orphan that would hold the lock until its session ends. The node with
// the lowest sequence number holds the lock. Every other contender watches
// only the node just below its own (GetW on it), so a release wakes one
// process, not the herd; when that node goes, the contender lists the
// folder again, since its predecessor may have given up while an earlier
// node still holds (unless the predecessor was the only node below its
// own: sequence numbers only grow, so it is the lowest now).
//
// Inside one process only one goroutine per name talks to ZooKeeper: the
// others queue behind it in a handoff.Queue (first come, first served).
// A holder's Release passes its node to the next local waiter, without a
// round trip through ZooKeeper's queue, as long as its budget allows: the
// number of local waiters counted when the process got the lock from
// ZooKeeper, so that other processes queued meanwhile are served after that
// batch and not starved. Then the holder deletes its node (with its
// version: only its own) and the next in ZooKeeper's order holds.
//
// # Fencing tokens
//
// A holder that got the lock from ZooKeeper makes one write before it
// holds: a multi that checks its lock node (the node is never written, so
// version 0 means "still there": our session lives), checks the version of
// the fence node <prefix>/n/fence, whose data is a base B (0 until
// AdvanceFence raises it), and writes the process's own token node
// <prefix>/n/token-<id> (an ephemeral node nothing else touches). If the
// lock node is gone, the write fails and the would-be holder goes back to
// ZooKeeper's queue instead of holding.
//
// The token has two parts: B + z<<16 + i, where z is the multi's zxid and
// i the holder's place in its batch. The holder that wrote is place 0;
// each local hand-over gives the next holder the next place, without a
// write of its own (a batch that would pass 65,536 holders writes again).
// The arithmetic is the one every backend of package locking shares
// (locking.Batch, with z as the batch's epoch).
//
// The invariant: tokens grow with every new holder. Inside a batch, i
// grows. A batch's write happens after the previous holder's (the previous
// holder deleted its node only after its own write succeeded; a waiter
// writes only after it saw that deletion), ZooKeeper orders writes by
// zxid, the multi itself checks that B at zxid z is the B it adds, and B
// only grows: a later batch's z' > z gives B' + z'<<16 > B + z<<16 + i for
// every i < 1<<16. So tokens grow strictly in every process and across
// server restarts (a restart begins a new epoch, the high half of the
// zxid). AdvanceFence(atLeast) writes this process's token node to learn
// a zxid n below every later write's, and raises B, if it must, to
// atLeast - (n+1)<<16 + 1, so every later batch's tokens are above atLeast
// (raising B to atLeast itself would add a zxid's worth of tokens at each
// call, and they would run out); this process hands on no place of an
// earlier batch at or below it (it skips to the batch's first place above
// it, if there is one, else its next holder writes; another process may:
// the store refuses it, that process advances the fence in turn, and its
// next holder skips or writes). Once AdvanceFence has returned, no lease of
// this process begins with a token at or below atLeast, however its token
// was taken: a holder compares it with the floor as its lease begins, under
// the lock the floor is raised under, and takes another if it must.
//
// A hand-over without a write trusts the session: it is made only while
// the client has not lost its connection since the batch's write (the
// connection's epoch) and within a third of the session timeout of it, as
// a renewal would be; past that the next holder writes again, and that
// write fails if the node is gone. A holder handed a place after its
// session silently ended holds a token below every holder that came after
// the end, so the store refuses its writes: the token, not the belief in
// the lock, makes a late write harmless.
//
// The write goes to a node of the process's own rather than the lock node
// (a SetData there would do as well for the token) because the next
// process in line watches the lock node: a write on it would wake that
// process for nothing at every batch.
//
// Why not the node's creation zxid (czxid), as tokens often are? Because of
// the local hand-over: g1 of process P holds on P's node N, g2 of P queues
// locally, and process Q queues in ZooKeeper with node M, czxid(M) >
// czxid(N). g1 hands N to g2. With czxid as token g2 gets g1's token (a
// store that refuses equal tokens refuses g2; one that accepts them
// accepts g1's late write); with czxid(N)+1 it may equal czxid(M), Q's
// token after g2. The batch's own write, after everything its
// predecessors did, and the place in the batch give each holder a token of
// its own.
//
// # Fairness
//
// Inside a process the queue is FIFO; in ZooKeeper, the sequence numbers'
// order. A process that got the lock hands it on locally at most as many
// times as it had local waiters then; when that budget is used up it looks
// at the folder (one read, and only if it was alone when it got the lock)
// and renews the budget if no other process has queued meanwhile, else it
// deletes its node and the next process holds.
//
// # Sessions: SUSPENDED and LOST
//
// The session is part of the lock. When the client loses its connection
// (zk.StateDisconnected: Curator's SUSPENDED) a holder cannot know whether
// its session, and so its node, still lives: every lease's context is
// cancelled at once with a cause wrapping locking.ErrLockLost, and such a
// hold is never handed on. When the session expires (zk.StateExpired:
// LOST) its nodes are gone; a waiter sees its node missing and fails with a
// locking.NodeError of zk.ErrSessionExpired. The client then reconnects
// with a new session, on which later Acquires work.
//
// A paused process can still believe it holds the lock after its session
// expired: only the token, checked by the resource, makes a late write
// harmless.
package zklock
