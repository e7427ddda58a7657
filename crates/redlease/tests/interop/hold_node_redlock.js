// Holds a lock with node-redlock (v5, on ioredis) until a line arrives on stdin, then
// releases it. Prints "held" and "released".
const Redis = require("ioredis");
const Redlock = require("redlock").default;
const readline = require("readline");

const [port, key, ttlMs] = [Number(process.argv[2]), process.argv[3], Number(process.argv[4])];
const client = new Redis({ host: "127.0.0.1", port });
const redlock = new Redlock([client], { retryCount: 0 });

(async () => {
  const lock = await redlock.acquire([key], ttlMs);
  console.log("held");
  const lines = readline.createInterface({ input: process.stdin });
  for await (const _ of lines) break;
  lines.close();
  await lock.release();
  console.log("released");
  client.disconnect();
  process.exit(0);
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
