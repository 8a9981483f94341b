// Types for the AudioWorkletGlobalScope, which TypeScript's DOM library does not describe.
// Only for `npm run typecheck`; no runtime file loads this.
declare class AudioWorkletProcessor {
  readonly port: MessagePort;
  constructor(options?: { processorOptions?: any });
}
declare function registerProcessor(name: string, ctor: new (options: any) => AudioWorkletProcessor): void;
declare const currentTime: number;
declare const currentFrame: number;
declare const sampleRate: number;
