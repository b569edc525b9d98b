// A Node.js client of NInfer's public API, as a user outside Python would write it:
// @grpc/grpc-js + @grpc/proto-loader on proto/ninfer/v1/generation.proto, and the shipped
// proto/google/rpc/status.proto to decode the rich error trailer.
//
// Usage: node client.mjs PROTO_DIR TARGET JOB_JSON
//   JOB_JSON: {"op": "generate", "request": {...GenerateRequest as JSON...}}
//          or {"op": "count_tokens", "request": {...CountTokensRequest...}}
// Prints one JSON object on stdout:
//   generate:      {"ok": true, "text": "...", "finish": {...}, "num_messages": N}
//   count_tokens:  {"ok": true, "response": {...}}
//   a gRPC error:  {"ok": false, "code": N, "details": "...", "error_detail": {...} | null}
import path from "node:path";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import protobuf from "protobufjs";

const [protoDir, target, jobJson] = process.argv.slice(2);
const job = JSON.parse(jobJson);

const loaderOptions = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
                        includeDirs: [protoDir] };
const pkgDef = protoLoader.loadSync("ninfer/v1/generation.proto", loaderOptions);
const ninfer = grpc.loadPackageDefinition(pkgDef).ninfer.v1;
const client = new ninfer.Generation(target, grpc.credentials.createInsecure());

// google.rpc.Status {details: [Any(ninfer.v1.ErrorDetail)]} from the grpc-status-details-bin trailer.
const root = new protobuf.Root();
root.resolvePath = (_origin, target) => path.join(protoDir, target);
root.loadSync(["google/rpc/status.proto", "ninfer/v1/generation.proto"], { keepCase: true });
root.resolveAll();
const Status = root.lookupType("google.rpc.Status");
const ErrorDetail = root.lookupType("ninfer.v1.ErrorDetail");

function errorResult(err) {
  let detail = null;
  const bin = err.metadata ? err.metadata.get("grpc-status-details-bin") : [];
  if (bin.length > 0) {
    const st = Status.decode(bin[0]);
    for (const any of st.details) {
      if (any.type_url.endsWith("/ninfer.v1.ErrorDetail")) {
        detail = ErrorDetail.toObject(ErrorDetail.decode(any.value));
      }
    }
  }
  return { ok: false, code: err.code, details: err.details, error_detail: detail };
}

let done = false;
function finish(result) {
  // grpc-js may emit both "end" and "error" for a failed stream: the first one wins.
  if (done) return;
  done = true;
  process.stdout.write(JSON.stringify(result) + "\n");
  client.close();
}

const deadline = new Date(Date.now() + 600_000);
if (job.op === "generate") {
  const call = client.Generate(job.request, { deadline });
  let text = "";
  let fin = null;
  let n = 0;
  call.on("data", (msg) => {
    n += 1;
    text += msg.text;
    if (msg.finish) fin = msg.finish;
  });
  call.on("error", (err) => finish(errorResult(err)));
  // "status" comes after "end" and says whether the stream ended OK.
  call.on("status", (st) => {
    if (st.code === grpc.status.OK) finish({ ok: true, text, finish: fin, num_messages: n });
  });
} else if (job.op === "count_tokens") {
  client.CountTokens(job.request, { deadline }, (err, resp) => {
    finish(err ? errorResult(err) : { ok: true, response: resp });
  });
} else {
  throw new Error(`unknown op ${job.op}`);
}
