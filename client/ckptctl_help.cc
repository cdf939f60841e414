#include "client/ckptctl_help.h"

#include "absl/strings/str_cat.h"

namespace ckpt::ctl {
namespace {

constexpr char kExitStatus[] =
    "EXIT STATUS\n"
    "    0  success\n"
    "    1  the daemon refused or failed the command (the reason is on\n"
    "       stderr: not found, permission denied, ...), or a local file\n"
    "       could not be written\n"
    "    2  bad usage\n"
    "    3  verify found damage\n"
    "    4  no daemon answers at the socket, or it is stopping\n";

constexpr char kCommon[] =
    "COMMON OPTIONS\n"
    "    --socket PATH\n"
    "        The daemon's gRPC socket. Default: $CKPTD_SOCKET; else, in a Slurm\n"
    "        job, /tmp/ckptd-slurm-<uid>-<job>/ckptd.sock if it exists; else\n"
    "        $XDG_RUNTIME_DIR/ckptd/ckptd.sock if it exists; else\n"
    "        /run/ckptd/ckptd.sock.\n"
    "    -h, --help\n"
    "        This page.\n\n";

struct Page {
  const char* name;
  const char* summary;  // one line, for `ckptctl --help`
  const char* body;     // SYNOPSIS, DESCRIPTION and OPTIONS
};

constexpr Page kPages[] = {
    {"status", "the daemon and its saves in flight, with progress",
     "SYNOPSIS\n"
     "    ckptctl [--socket PATH] status [--watch] [--json]\n\n"
     "DESCRIPTION\n"
     "    Prints the daemon's version, node, storage root, I/O backend, staging\n"
     "    pool use, peak memory and open sessions, then one line per save in\n"
     "    flight: job/checkpoint, rank, phase, bars of the bytes staged and\n"
     "    written, the write rate and the time left at that rate. If the\n"
     "    daemon's start cleaned up after a crash, \"at start:\" lists what it\n"
     "    did: temporaries and uncommitted checkpoints removed, LATEST\n"
     "    repaired, checkpoints left and why, errors. Users see only their own\n"
     "    jobs' saves and lines; root, the daemon's user and the operator group\n"
     "    see all. With --remote, \"remote tier\" gives the tier's counters\n"
     "    (backlog, bytes uploaded, uploads committed and failed, S3 retries,\n"
     "    checkpoints deleted by --remote_keep_last) and one line per upload\n"
     "    waiting, running or recently ended, with its rate.\n\n"
     "OPTIONS\n"
     "    --watch\n"
     "        Redraw every 0.5 s until interrupted (on a terminal, in place).\n"
     "    --json\n"
     "        The daemon's whole answer as one JSON object (DaemonStatusResponse\n"
     "        of proto/ckpt/v1/control.proto, field names as in the proto); with\n"
     "        --watch, one object per line.\n\n"},
    {"list", "checkpoints of a job or of every job: size, age, committed, latest",
     "SYNOPSIS\n"
     "    ckptctl [--socket PATH] list [--json] [JOB]\n\n"
     "DESCRIPTION\n"
     "    One line per checkpoint of JOB (default: every job the caller may\n"
     "    see): its state (committed or uncommitted), the ranks that saved it,\n"
     "    its size on storage, its age and commit time (UTC), and which one\n"
     "    is LATEST. WHERE names the tiers that hold it committed: memory\n"
     "    (this daemon's memory tier), local (--root), remote (--remote; a\n"
     "    checkpoint there alone is listed too); UPLOAD, this node's upload of\n"
     "    it to the remote tier: queued, a percentage, committing or failed.\n\n"
     "OPTIONS\n"
     "    --json\n"
     "        One JSON object, {\"checkpoints\": [...]} (ListCheckpointsResponse\n"
     "        of proto/ckpt/v1/control.proto).\n\n"},
    {"cancel", "cancel a checkpoint in flight",
     "SYNOPSIS\n"
     "    ckptctl [--socket PATH] cancel JOB CHECKPOINT\n\n"
     "DESCRIPTION\n"
     "    Cancels every rank's save of a checkpoint that has not committed:\n"
     "    the trainers' waits end with CANCELLED and the checkpoint's files\n"
     "    are removed. A committed checkpoint cannot be cancelled. Allowed to\n"
     "    the job's owner, root, the daemon's user and the operator group.\n\n"},
    {"gc", "remove uncommitted checkpoints that can never commit; apply retention",
     "SYNOPSIS\n"
     "    ckptctl [--socket PATH] gc [JOB]\n\n"
     "DESCRIPTION\n"
     "    Removes the uncommitted checkpoints of JOB (default: every job; then\n"
     "    only for root, the daemon's user and the operator group) that are\n"
     "    older than its newest committed one and that no daemon is writing,\n"
     "    and prints each one removed and each one left with the reason. Then\n"
     "    applies retention now: with keep_last N, committed checkpoints older\n"
     "    than the newest N go, as after a commit (none that a load is\n"
     "    reading). Only directories ckptd made are ever removed.\n\n"},
    {"verify", "re-read a checkpoint and check every stored byte",
     "SYNOPSIS\n"
     "    ckptctl [--socket PATH] verify JOB [CHECKPOINT]\n\n"
     "DESCRIPTION\n"
     "    Re-reads every file of CHECKPOINT (default: LATEST) and checks every\n"
     "    block against the checksums of its COMMIT record, the safetensors\n"
     "    headers included. Prints each problem (file and item) and a summary\n"
     "    with their total; exits 3 if there is any. Past the first 1,000\n"
     "    problems (or 256 KiB of them) one last line counts the rest:\n"
     "    \"and N more problems not listed: T in all\". Holds a read lease,\n"
     "    so retention does not delete the checkpoint while it runs.\n\n"},
    {"inspect", "the index of a committed checkpoint",
     "SYNOPSIS\n"
     "    ckptctl [--socket PATH] inspect [--json] JOB [CHECKPOINT]\n\n"
     "DESCRIPTION\n"
     "    Prints CHECKPOINT's (default: LATEST) files with their sizes, owner\n"
     "    ranks and replicas, every stored tensor chunk (dtype, global shape,\n"
     "    offsets, local shape, file) and every byte item.\n\n"
     "OPTIONS\n"
     "    --json\n"
     "        The whole COMMIT record as JSON (CommitRecord of\n"
     "        proto/ckpt/v1/manifest.proto).\n\n"},
    {"export", "the model weights as Hugging Face safetensors files",
     "SYNOPSIS\n"
     "    ckptctl [--socket PATH] export JOB [CHECKPOINT] --format hf --out DIR\n"
     "            [--prefix P] [--max_file_bytes N] [--buffer_bytes N]\n\n"
     "DESCRIPTION\n"
     "    Writes the tensors of CHECKPOINT (default: LATEST) whose fqn starts\n"
     "    with P, named without it, as whole tensors (consolidated from every\n"
     "    rank's shards) into model-0000N-of-0000M.safetensors files and\n"
     "    model.safetensors.index.json, the layout Hugging Face's\n"
     "    from_pretrained reads. Optimizer state and Python values are left\n"
     "    out. The bytes are loaded through the daemon, which verifies every\n"
     "    block before it delivers it: a damaged checkpoint fails the export.\n"
     "    Files appear whole (written under a temporary name, synced, renamed)\n"
     "    and the index last; a failed export leaves no file. Runs as a trainer\n"
     "    of the job: the caller must own it (or be root).\n\n"
     "OPTIONS\n"
     "    --format hf\n"
     "        The output format; hf is the one there is.\n"
     "    --out DIR\n"
     "        A new or empty directory: nothing already there is overwritten.\n"
     "        A symbolic link on the way is followed only if it, and the\n"
     "        directory holding it, are the caller's or root's. The files are\n"
     "        the caller's, mode 0600 (a job's files are its owner's alone); a\n"
     "        DIR the export makes is mode 0700.\n"
     "    --prefix P\n"
     "        Which tensors are the model's (default \"model.\", as a state dict\n"
     "        {\"model\": model.state_dict(), \"optim\": ...} saves them).\n"
     "    --max_file_bytes N\n"
     "        Largest file (default 5GB); a larger tensor gets a file of its\n"
     "        own. N takes B, KB, MB, GB, KiB, MiB or GiB.\n"
     "    --buffer_bytes N\n"
     "        The export's memory (default 256MiB): tensors are loaded in\n"
     "        dim-0 slices that fit, several small ones at a time.\n\n"},
};

}  // namespace

std::string Summary() {
  std::string out =
      "usage: ckptctl [--socket PATH] COMMAND [ARGS]\n"
      "       ckptctl COMMAND --help    the manual of COMMAND\n\n"
      "COMMANDS\n";
  for (const Page& p : kPages) absl::StrAppend(&out, "    ", p.name, "\n        ", p.summary, "\n");
  absl::StrAppend(&out, "\n", kCommon, kExitStatus);
  return out;
}

std::string CommandPage(absl::string_view command) {
  for (const Page& p : kPages) {
    if (command == p.name) {
      return absl::StrCat("NAME\n    ckptctl ", p.name, " - ", p.summary, "\n\n", p.body,
                          kCommon, kExitStatus);
    }
  }
  return "";
}

}  // namespace ckpt::ctl
